// Small helpers shared by the tests.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "op_info.h"
#include "program_impl.h"
#include "switchboard/builder.h"
#include "switchboard/model.h"
#include "switchboard/switchboard.h"

namespace switchboard::testing {

#define SB_ASSERT_OK(expr)                                  \
  do {                                                      \
    ::switchboard::Status sb_st_ = (expr);                  \
    ASSERT_TRUE(sb_st_.is_ok()) << sb_st_.to_string();     \
  } while (0)

// DIR/name, DIR a temp folder of this process's own (prefix_pid), emptied of name and created:
// ctest runs a file's tests as parallel processes, which must not share a path.
inline std::filesystem::path process_scratch(const std::string& prefix, const std::string& name) {
  namespace fs = std::filesystem;
  fs::path p = fs::temp_directory_path() / (prefix + "_" + std::to_string(::getpid())) / name;
  fs::remove_all(p);
  fs::create_directories(p.parent_path());
  return p;
}

inline Tensor f32(const Shape& shape, const std::vector<float>& v) {
  return Tensor::from_vector<float>(DType::kF32, shape, v).value();
}

inline std::vector<float> floats(const Tensor& t) {
  const float* p = t.data_as<float>();
  return std::vector<float>(p, p + t.numel());
}

// Op name -> count over every chain of a serialized program.
inline std::map<std::string, int> op_counts(const std::vector<uint8_t>& bytes) {
  std::map<std::string, int> counts;
  auto ir = parse_program(bytes);
  if (!ir.is_ok()) {
    ADD_FAILURE() << ir.status().to_string();
    return counts;
  }
  for (const auto& c : (*ir)->chains)
    for (const auto& ins : c->instructions) ++counts[op_name(ins->op.type)];
  return counts;
}

inline std::unique_ptr<fb::ProgramT> unpack(const std::vector<uint8_t>& bytes) {
  auto ir = parse_program(bytes);
  EXPECT_TRUE(ir.is_ok()) << ir.status().to_string();
  return ir.is_ok() ? std::move(ir).value() : nullptr;
}

inline std::shared_ptr<const Program> load(const std::vector<uint8_t>& bytes) {
  auto p = Program::from_bytes(bytes, "test");
  EXPECT_TRUE(p.is_ok()) << p.status().to_string();
  return p.is_ok() ? *p : nullptr;
}

// The tiny test model (group 64, `bits`-bit linears, weights from `seed`) exported to `out`.
inline Status export_tiny_model(const std::string& out, int bits = 4, uint64_t seed = 2026,
                                const std::string& family = "") {
  SB_ASSIGN_OR_RETURN(const models::ModelConfig c, models::tiny_test_config(family));
  models::ExportFormat f;
  f.bits = bits;
  f.group_size = 64;
  return models::write_model(out, c, f, [&](const models::WeightSink& sink) {
    return models::random_weights(c, f, seed, sink);
  });
}

}  // namespace switchboard::testing
