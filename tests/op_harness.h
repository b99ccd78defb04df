// The op-test harness: a test builds a program, names its inputs and gives a
// reference that computes the expected outputs in double precision. check_op()
// serializes and loads the program, runs it on every test device, compares each
// output with the reference, and requires all devices to agree bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "switchboard/builder.h"
#include "switchboard/switchboard.h"

namespace switchboard::optest {

// How close an output must be to the reference. NaN matches any NaN, nothing else.
struct Tolerance {
  enum class Kind { kExact, kUlps, kRel } kind = Kind::kExact;
  double amount = 0;
  // Equal values, and -0 differs from +0: data movement, casts, correctly rounded arithmetic.
  static Tolerance exact() { return {Kind::kExact, 0}; }
  // At most n f32 units in the last place apart (+0 and -0 are 0 apart).
  static Tolerance f32_ulps(int n) { return {Kind::kUlps, static_cast<double>(n)}; }
  // |got - expected| <= r * |expected|; the caller says in a comment where r comes from.
  static Tolerance rel(double r) { return {Kind::kRel, r}; }

  bool accepts(double got, double want) const {
    if (std::isnan(got) || std::isnan(want)) return std::isnan(got) && std::isnan(want);
    if (kind == Kind::kExact) return got == want && std::signbit(got) == std::signbit(want);
    if (kind == Kind::kUlps) return std::fabs(ulp_key(got) - ulp_key(want)) <= amount;
    return got == want || std::fabs(got - want) <= amount * std::fabs(want);
  }
  std::string str() const {
    const char* names[] = {"exact", "f32_ulps", "rel"};
    return std::string(names[static_cast<int>(kind)]) + (kind == Kind::kExact ? "" : "(" + num(amount) + ")");
  }
  // Position of a float on the number line counted in ulps, so adjacent floats differ by 1.
  static double ulp_key(double v) {
    uint32_t u = f32_bits(static_cast<float>(v));
    return (u >> 31) ? -static_cast<double>(u & 0x7fffffffu) : static_cast<double>(u);
  }
  static std::string num(double v) {
    std::ostringstream os;
    os.precision(17);
    os << v;
    return os.str();
  }
};

// Expected contents of one output (or, when no output has that name, a mutable buffer), row-major.
struct RefTensor {
  Shape shape;
  std::vector<double> values;
  std::vector<int64_t> ints;  // used instead of `values` when set: exact integers (i64 beyond 2^53)
};
using Inputs = std::map<std::string, Tensor>;
using Expected = std::map<std::string, RefTensor>;
using Reference = std::function<Expected(const Inputs&)>;

// A tensor of dtype `t` holding `v`, converted as the kernels store (f16/bf16 via f32, RNE).
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
      case DType::kU8: put(static_cast<uint8_t>(v[i])); break;
      case DType::kU32: put(static_cast<uint32_t>(v[i])); break;
      case DType::kBool: put(static_cast<uint8_t>(v[i] != 0)); break;
    }
  }
  return out;
}

// Exact integer elements of an integer or bool tensor (doubles lose i64 beyond 2^53).
inline std::vector<int64_t> ints_of(const Tensor& t) {
  std::vector<int64_t> out(static_cast<size_t>(t.numel()));
  const auto* p = static_cast<const uint8_t*>(t.data());
  for (size_t i = 0; i < out.size(); ++i) {
    auto get = [&](auto x) { std::memcpy(&x, p + i * sizeof(x), sizeof(x)); return static_cast<int64_t>(x); };
    if (t.dtype() == DType::kI32) out[i] = get(int32_t{});
    else if (t.dtype() == DType::kI64) out[i] = get(int64_t{});
    else if (t.dtype() == DType::kU32) out[i] = get(uint32_t{});
    else out[i] = get(uint8_t{});  // u8 and bool; float dtypes are not integers
  }
  return out;
}

// `v` rounded to f32, then (for f16/bf16) to the 16-bit format: "computed in f32, rounded once on store".
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

inline std::string index_str(const Shape& shape, int64_t flat) {
  std::string s;
  for (size_t k = shape.size(); k-- > 0; flat /= shape[k])
    s = std::to_string(flat % shape[k]) + (s.empty() ? "" : ", ") + s;
  return "[" + s + "]";
}

inline void expect_matches(const std::string& what, const Tensor& got, const RefTensor& want, Tolerance tol) {
  const bool exact_ints = !want.ints.empty();
  const size_t n = exact_ints ? want.ints.size() : want.values.size();
  if (got.shape() != want.shape || static_cast<int64_t>(n) != got.numel()) {
    ADD_FAILURE() << what << ": shape " << shape_str(got.shape()) << ", reference " << shape_str(want.shape) << " ("
                  << n << " values)";
    return;
  }
  std::vector<double> g = got.to_doubles();
  std::vector<int64_t> gi = exact_ints ? ints_of(got) : std::vector<int64_t>{};
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < n; ++i) {
    if (exact_ints ? gi[i] == want.ints[i] : tol.accepts(g[i], want.values[i])) continue;
    if (bad++ == 0) first = static_cast<int64_t>(i);
  }
  if (bad == 0) return;
  auto at = static_cast<size_t>(first);
  ADD_FAILURE() << what << ": " << bad << " of " << n << " elements differ (" << (exact_ints ? "exact" : tol.str())
                << "); first at index " << first << " " << index_str(got.shape(), first) << ": got "
                << (exact_ints ? std::to_string(gi[at]) : Tolerance::num(g[at])) << ", expected "
                << (exact_ints ? std::to_string(want.ints[at]) : Tolerance::num(want.values[at]));
}

// Bytes of `t` with every float NaN replaced by one canonical NaN (payloads may differ by device).
inline std::vector<uint8_t> canonical_bytes(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data());
  std::vector<uint8_t> b(p, p + t.nbytes());
  std::vector<double> v = dtype_is_float(t.dtype()) ? t.to_doubles() : std::vector<double>{};
  const size_t esz = dtype_size(t.dtype());
  for (size_t i = 0; i < v.size(); ++i)
    if (std::isnan(v[i])) std::memset(b.data() + i * esz, 0xff, esz);
  return b;
}

inline void expect_bitwise_equal(const std::string& what, const Tensor& got, const Tensor& first) {
  if (got.dtype() != first.dtype() || got.shape() != first.shape()) {
    ADD_FAILURE() << what << ": " << dtype_name(got.dtype()) << shape_str(got.shape()) << " vs the first device's "
                  << dtype_name(first.dtype()) << shape_str(first.shape());
    return;
  }
  std::vector<uint8_t> a = canonical_bytes(got), b = canonical_bytes(first);
  const size_t esz = dtype_size(got.dtype());
  for (size_t i = 0; i < a.size(); i += esz) {
    if (std::memcmp(&a[i], &b[i], esz) == 0) continue;
    auto e = static_cast<int64_t>(i / esz);
    ADD_FAILURE() << what << ": not bitwise equal to the first device; first at index " << e << " "
                  << index_str(got.shape(), e) << ": got " << Tolerance::num(got.to_doubles()[i / esz])
                  << ", first device " << Tolerance::num(first.to_doubles()[i / esz]);
    return;
  }
}

// A session on `device`, or null. Only a non-cpu device that is absent or lacks a kernel is skipped;
// cpu is the reference device, so its failure to open fails the test.
inline std::unique_ptr<Session> open_session(std::shared_ptr<const Program> program, const std::string& device) {
  auto s = Session::create(std::move(program), SessionOptions{device});
  if (s.is_ok()) return std::move(s).value();
  StatusCode c = s.status().code();
  if (device != "cpu" && (c == StatusCode::kNotFound || c == StatusCode::kUnimplemented)) {
    std::printf("[  SKIPPED ] %s: %s\n", device.c_str(), s.status().to_string().c_str());
    std::fflush(stdout);
  } else {
    ADD_FAILURE() << device << ": Session::create: " << s.status().to_string();
  }
  return nullptr;
}

inline std::shared_ptr<const Program> load(const ProgramBuilder& b) {
  auto bytes = b.serialize();
  EXPECT_TRUE(bytes.is_ok()) << "serialize: " << bytes.status().to_string();
  if (!bytes.is_ok()) return nullptr;
  auto program = Program::from_bytes(std::move(bytes).value(), "op_test");
  EXPECT_TRUE(program.is_ok()) << "from_bytes: " << program.status().to_string();
  return program.is_ok() ? program.value() : nullptr;
}

// Sets the inputs and runs; a failure to set an input fails the test.
inline Status run(Session& s, const Inputs& inputs) {
  for (const auto& [name, t] : inputs) {
    Status st = s.set_input(name, t);
    EXPECT_TRUE(st.is_ok()) << s.device_name() << ": set_input(" << name << "): " << st.to_string();
    if (!st.is_ok()) return st;
  }
  return s.execute();
}

}  // namespace detail

// Runs the program on every test device; each output matches `ref` within `tol`, and every device
// matches the first one bitwise. Names in the reference that are not outputs are mutable buffers.
inline void check_op(const ProgramBuilder& b, const Inputs& inputs, const Reference& ref, Tolerance tol) {
  std::shared_ptr<const Program> program = detail::load(b);
  if (!program) return;
  const Expected want = ref(inputs);
  std::map<std::string, bool> is_output;
  for (const IoInfo& o : program->outputs()) {
    is_output[o.name] = true;
    if (!want.count(o.name)) ADD_FAILURE() << "output '" << o.name << "' has no reference";
  }
  std::map<std::string, Tensor> first;
  for (const std::string& dev : test_devices()) {
    std::unique_ptr<Session> s = detail::open_session(program, dev);
    if (!s) continue;
    Status st = detail::run(*s, inputs);
    if (!st.is_ok()) {
      ADD_FAILURE() << dev << ": " << st.to_string();
      continue;
    }
    for (const auto& [name, expected] : want) {
      auto got = is_output.count(name) ? s->output(name) : s->mutable_buffer(name);
      if (!got.is_ok()) {
        ADD_FAILURE() << dev << ": " << name << ": " << got.status().to_string();
        continue;
      }
      detail::expect_matches(dev + " '" + name + "'", *got, expected, tol);
      if (!first.count(name)) first[name] = *got;
      else detail::expect_bitwise_equal(dev + " '" + name + "'", *got, first[name]);
    }
  }
}

// Runs the program on every test device; execute() must fail with a message containing `needle`.
inline void check_op_error(const ProgramBuilder& b, const Inputs& inputs, const std::string& needle) {
  std::shared_ptr<const Program> program = detail::load(b);
  if (!program) return;
  for (const std::string& dev : test_devices()) {
    std::unique_ptr<Session> s = detail::open_session(program, dev);
    if (!s) continue;
    Status st = detail::run(*s, inputs);
    EXPECT_FALSE(st.is_ok()) << dev << ": execute() succeeded, expected an error containing '" << needle << "'";
    EXPECT_NE(st.message().find(needle), std::string::npos) << dev << ": " << st.to_string();
  }
}

}  // namespace switchboard::optest
