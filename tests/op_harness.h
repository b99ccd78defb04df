// The op-test harness. A test builds a program, names its input tensors and gives a reference that
// computes the expected outputs in double precision. check_op() serializes and loads the program, runs it
// on every test device, compares each output with the reference, and requires the devices to agree bitwise.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "switchboard/builder.h"
#include "switchboard/switchboard.h"

namespace switchboard::optest {

inline std::string num(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

// How close an output must be to the reference. NaN matches any NaN and nothing else.
struct Tolerance {
  enum Kind { kExact, kUlps, kRel } kind = kExact;
  double amount = 0;
  // Equal values, -0 differs from +0: data movement, casts, correctly rounded arithmetic.
  static Tolerance exact() { return {kExact, 0}; }
  // At most n f32 units in the last place apart.
  static Tolerance f32_ulps(int n) { return {kUlps, static_cast<double>(n)}; }
  // |got - expected| <= r * |expected|; the caller says in a comment where r comes from.
  static Tolerance rel(double r) { return {kRel, r}; }

  bool accepts(double got, double want) const {
    if (std::isnan(got) || std::isnan(want)) return std::isnan(got) && std::isnan(want);
    if (kind == kExact) return got == want && std::signbit(got) == std::signbit(want);
    if (kind == kUlps) return std::fabs(ulp_pos(got) - ulp_pos(want)) <= amount;
    return got == want || std::fabs(got - want) <= amount * std::fabs(want);
  }
  std::string str() const {
    return kind == kExact ? "exact" : (kind == kUlps ? "f32_ulps(" : "rel(") + num(amount) + ")";
  }
  // Position of the nearest float on the number line, in ulps (+0 and -0 are both 0).
  static double ulp_pos(double v) {
    uint32_t u = f32_bits(static_cast<float>(v));
    return (u >> 31) ? -static_cast<double>(u & 0x7fffffffu) : static_cast<double>(u);
  }
};

// Expected contents of one output, or of a mutable buffer when no output has that name; row-major.
struct RefTensor {
  Shape shape;
  std::vector<double> values;
  std::vector<int64_t> ints;  // when set, used instead of `values`: exact integers (i64 beyond 2^53)
};
using Inputs = std::map<std::string, Tensor>;
using Expected = std::map<std::string, RefTensor>;
using Reference = std::function<Expected(const Inputs&)>;

// A tensor of dtype t holding v, stored as the kernels store (f16/bf16: via f32, round to nearest even).
inline Tensor make(DType t, const Shape& shape, const std::vector<double>& v) {
  Tensor out = Tensor::zeros(t, shape).value();
  EXPECT_EQ(static_cast<int64_t>(v.size()), out.numel()) << "make(): value count does not match the shape";
  auto* p = static_cast<uint8_t*>(out.mutable_data());
  for (size_t i = 0; i < v.size() && static_cast<int64_t>(i) < out.numel(); ++i) {
    auto put = [&](auto x) { std::memcpy(p + i * sizeof(x), &x, sizeof(x)); };
    auto f = static_cast<float>(v[i]);
    switch (t) {
      case DType::kF32: put(f); break;
      case DType::kF16: put(f32_to_f16(f)); break;
      case DType::kBF16: put(f32_to_bf16(f)); break;
      case DType::kI32: put(static_cast<int32_t>(v[i])); break;
      case DType::kI64: put(static_cast<int64_t>(v[i])); break;
      case DType::kU32: put(static_cast<uint32_t>(v[i])); break;
      case DType::kU8: put(static_cast<uint8_t>(v[i])); break;
      case DType::kBool: put(static_cast<uint8_t>(v[i] != 0)); break;
    }
  }
  return out;
}

// The exact elements of an integer or bool tensor (Tensor::to_doubles loses i64 beyond 2^53).
inline std::vector<int64_t> ints_of(const Tensor& t) {
  std::vector<int64_t> out(static_cast<size_t>(t.numel()));
  const auto* p = static_cast<const uint8_t*>(t.data());
  for (size_t i = 0; i < out.size(); ++i) {
    auto get = [&](auto x) {
      std::memcpy(&x, p + i * sizeof(x), sizeof(x));
      out[i] = static_cast<int64_t>(x);
    };
    switch (t.dtype()) {
      case DType::kI32: get(int32_t{}); break;
      case DType::kI64: get(int64_t{}); break;
      case DType::kU32: get(uint32_t{}); break;
      default: get(uint8_t{}); break;  // u8 and bool; float tensors have no exact integers to give
    }
  }
  return out;
}

// v rounded to f32, then (f16/bf16) to the 16-bit format: "computed in f32, rounded on store".
inline double round_to(DType t, double v) {
  auto f = static_cast<float>(v);
  if (t == DType::kF16) return f16_to_f32(f32_to_f16(f));
  if (t == DType::kBF16) return bf16_to_f32(f32_to_bf16(f));
  return t == DType::kF32 ? f : v;
}

// "cpu" plus the devices named in $SWITCHBOARD_TEST_DEVICES (comma separated).
inline std::vector<std::string> test_devices() {
  std::vector<std::string> out = {"cpu"};
  const char* env = std::getenv("SWITCHBOARD_TEST_DEVICES");
  std::stringstream ss(env ? env : "");
  for (std::string d; std::getline(ss, d, ',');) {
    d.erase(0, d.find_first_not_of(" \t"));
    d.erase(d.find_last_not_of(" \t") + 1);
    if (!d.empty() && std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  }
  return out;
}

namespace detail {

// "index 5 [1, 2]": the flat index and the multi-index of an element.
inline std::string at(const Shape& shape, int64_t flat) {
  std::string s;
  for (int64_t k = static_cast<int64_t>(shape.size()) - 1, f = flat; k >= 0; f /= shape[k--])
    s = std::to_string(f % shape[k]) + (s.empty() ? "" : ", ") + s;
  return "index " + std::to_string(flat) + " [" + s + "]";
}

inline void expect_matches(const std::string& what, const Tensor& got, const RefTensor& want, Tolerance tol) {
  const bool exact_ints = !want.ints.empty();
  const size_t n = exact_ints ? want.ints.size() : want.values.size();
  if (got.shape() != want.shape || static_cast<int64_t>(n) != got.numel()) {
    ADD_FAILURE() << what << ": shape " << shape_str(got.shape()) << ", reference " << shape_str(want.shape);
    return;
  }
  std::vector<double> g = got.to_doubles();
  std::vector<int64_t> gi = exact_ints ? ints_of(got) : std::vector<int64_t>{};
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; ++i)
    if ((exact_ints ? gi[i] != want.ints[i] : !tol.accepts(g[i], want.values[i])) && bad++ == 0) first = i;
  if (bad == 0) return;
  ADD_FAILURE() << what << ": " << bad << " of " << n << " elements differ (" << (exact_ints ? "exact" : tol.str())
                << "); first at " << at(got.shape(), static_cast<int64_t>(first)) << ": got "
                << (exact_ints ? std::to_string(gi[first]) : num(g[first])) << ", expected "
                << (exact_ints ? std::to_string(want.ints[first]) : num(want.values[first]));
}

// Element-wise bit equality with the first device's result; a NaN equals any NaN (payloads may differ).
inline void expect_bitwise_equal(const std::string& what, const Tensor& got, const Tensor& first) {
  if (got.dtype() != first.dtype() || got.shape() != first.shape()) {
    ADD_FAILURE() << what << ": " << dtype_name(got.dtype()) << shape_str(got.shape()) << ", the first device gave "
                  << dtype_name(first.dtype()) << shape_str(first.shape());
    return;
  }
  const size_t esz = dtype_size(got.dtype());
  const bool fl = dtype_is_float(got.dtype());
  std::vector<double> g = got.to_doubles(), f = first.to_doubles();
  for (size_t i = 0; i < g.size(); ++i) {
    const auto* a = static_cast<const uint8_t*>(got.data()) + i * esz;
    const auto* b = static_cast<const uint8_t*>(first.data()) + i * esz;
    if ((fl && std::isnan(g[i]) && std::isnan(f[i])) || std::memcmp(a, b, esz) == 0) continue;
    ADD_FAILURE() << what << ": not bitwise equal to the first device; first at "
                  << at(got.shape(), static_cast<int64_t>(i)) << ": got " << num(g[i]) << ", first device "
                  << num(f[i]);
    return;
  }
}

// A session on `device`, or null. A missing device, or one lacking a kernel, is skipped with a visible
// "[ DEVICE SKIPPED ]" line (not gtest's "[  SKIPPED ]", which ctest would take for the whole test
// being skipped, hiding the other devices' results); cpu is the reference device, so any failure to
// open it fails the test.
inline std::unique_ptr<Session> open_session(std::shared_ptr<const Program> program, const std::string& device) {
  auto s = Session::create(std::move(program), SessionOptions{device});
  if (s.is_ok()) return std::move(s).value();
  StatusCode c = s.status().code();
  if (device == "cpu" || (c != StatusCode::kNotFound && c != StatusCode::kUnimplemented)) {
    ADD_FAILURE() << device << ": Session::create: " << s.status().to_string();
  } else {
    std::printf("[ DEVICE SKIPPED ] %s: %s\n", device.c_str(), s.status().to_string().c_str());
    std::fflush(stdout);
  }
  return nullptr;
}

// Serializes and reloads the program, then runs `body` with a session with its inputs set, per device.
inline void for_each_device(const ProgramBuilder& b, const Inputs& inputs,
                            const std::function<void(const Program&, Session&, const std::string&)>& body) {
  auto bytes = b.serialize();
  ASSERT_TRUE(bytes.is_ok()) << "serialize: " << bytes.status().to_string();
  auto program = Program::from_bytes(std::move(bytes).value(), "op_test");
  ASSERT_TRUE(program.is_ok()) << "from_bytes: " << program.status().to_string();
  for (const std::string& dev : test_devices()) {
    std::unique_ptr<Session> s = open_session(*program, dev);
    if (!s) continue;
    for (const auto& [name, t] : inputs) ASSERT_TRUE(s->set_input(name, t).is_ok()) << dev << ": set_input " << name;
    body(**program, *s, dev);
  }
}

}  // namespace detail

// Every output (and every reference name that is a mutable buffer) matches `ref` within `tol` on every
// device, and each device's result is bitwise equal to the first device's.
inline void check_op(const ProgramBuilder& b, const Inputs& inputs, const Reference& ref, Tolerance tol) {
  const Expected want = ref(inputs);
  std::map<std::string, Tensor> first;
  detail::for_each_device(b, inputs, [&](const Program& program, Session& s, const std::string& dev) {
    std::map<std::string, bool> is_output;
    for (const IoInfo& o : program.outputs()) is_output[o.name] = true;
    for (const auto& [name, unused] : is_output)
      EXPECT_TRUE(want.count(name)) << "output '" << name << "': no reference";
    Status st = s.execute();
    if (!st.is_ok()) {
      ADD_FAILURE() << dev << ": " << st.to_string();
      return;
    }
    for (const auto& [name, expected] : want) {
      auto got = is_output.count(name) ? s.output(name) : s.mutable_buffer(name);
      if (!got.is_ok()) {
        ADD_FAILURE() << dev << ": " << got.status().to_string();
        continue;
      }
      detail::expect_matches(dev + " '" + name + "'", *got, expected, tol);
      if (first.count(name))
        detail::expect_bitwise_equal(dev + " '" + name + "'", *got, first[name]);
      else
        first[name] = *got;
    }
  });
}

// A tensor of dtype t with values drawn from `dist` (any <random> distribution of doubles).
template <typename Dist>
Tensor random_tensor(DType t, const Shape& shape, std::mt19937& rng, Dist dist) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = dist(rng);
  return make(t, shape, v);
}

// A fused op against the ops it replaces: on every device each pair's two outputs (or mutable
// buffers) hold the same bits, and each named one the CPU's bits.
inline void check_same_bits(const ProgramBuilder& b, const Inputs& inputs,
                            const std::vector<std::pair<std::string, std::string>>& pairs) {
  std::map<std::string, Tensor> first;
  detail::for_each_device(b, inputs, [&](const Program& program, Session& s, const std::string& dev) {
    Status st = s.execute();
    ASSERT_TRUE(st.is_ok()) << dev << ": " << st.to_string();
    auto get = [&](const std::string& name) {
      for (const IoInfo& o : program.outputs())
        if (o.name == name) return s.output(name);
      return s.mutable_buffer(name);
    };
    for (const auto& [a, b_name] : pairs) {
      auto x = get(a), y = get(b_name);
      ASSERT_TRUE(x.is_ok() && y.is_ok()) << dev << ": " << a << ", " << b_name;
      ASSERT_EQ(x->shape(), y->shape()) << dev << ": " << a;
      EXPECT_EQ(std::memcmp(x->data(), y->data(), y->nbytes()), 0)
          << dev << ": '" << a << "' differs from '" << b_name << "'";
      for (const auto& [name, t] : {std::pair{a, *x}, std::pair{b_name, *y}}) {
        auto [it, fresh] = first.emplace(name, t);
        if (!fresh) {
          EXPECT_EQ(std::memcmp(t.data(), it->second.data(), t.nbytes()), 0)
              << dev << ": '" << name << "' differs from the CPU";
        }
      }
    }
  });
}

// execute() fails on every device, with a message containing `needle`.
inline void check_op_error(const ProgramBuilder& b, const Inputs& inputs, const std::string& needle) {
  detail::for_each_device(b, inputs, [&](const Program&, Session& s, const std::string& dev) {
    Status st = s.execute();
    EXPECT_FALSE(st.is_ok()) << dev << ": execute() succeeded; expected an error containing '" << needle << "'";
    EXPECT_NE(st.message().find(needle), std::string::npos) << dev << ": " << st.to_string();
  });
}

}  // namespace switchboard::optest
