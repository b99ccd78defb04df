// Structural validation of every built kernel: its SPIR-V reflection (spirv-cross
// --reflect, run at build time) against the C++ kernel table (entry point, bindings
// and their access, push-constant fields, offsets and size, workgroup size); the
// MSL binding remap; and an exactness lint over the SPIR-V of exact kernels.
#include <gtest/gtest.h>
#include <spirv_cross/GLSL.std.450.h>
#include <spirv_cross/spirv.hpp>

#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_embedded_shaders.h"
#include "gpu_kernel_table.h"
#include "switchboard/builder.h"
#include "switchboard/switchboard.h"

namespace switchboard {
namespace {

using kernels::Access;
using kernels::KernelInfo;
using gpu::EmbeddedKernel;

struct Field {
  std::string name;
  uint32_t offset, size;
};

// "uint n; uint shape[SB_MAX_RANK]; float alpha;" -> names, std430 offsets of 32-bit scalars.
std::vector<Field> parse_fields(const std::string& text) {
  std::vector<Field> out;
  std::stringstream ss(text);
  uint32_t off = 0;
  for (std::string decl; std::getline(ss, decl, ';');) {
    std::stringstream ds(decl);
    std::string type, name;
    if (!(ds >> type >> name)) continue;
    uint32_t count = 1;
    if (auto b = name.find('['); b != std::string::npos) {
      count = name.substr(b + 1) == "SB_MAX_RANK]" ? SB_MAX_RANK : std::stoul(name.substr(b + 1));
      name = name.substr(0, b);
    }
    out.push_back({name, off, 4 * count});
    off += 4 * count;
  }
  return out;
}

const EmbeddedKernel& embedded(const KernelInfo& k) {
  const EmbeddedKernel* e = gpu::find_embedded_kernel(k.name);
  EXPECT_NE(e, nullptr) << k.name << " is in the kernel table but was not built (cmake/shaders.cmake)";
  static const EmbeddedKernel none{"", nullptr, 0, "", "{}"};
  return e ? *e : none;
}

TEST(ShaderStructure, TableAndBuiltKernelsAreTheSameSet) {
  std::set<std::string> table, built;
  for (const KernelInfo& k : kernels::kKernels) table.insert(k.name);
  for (size_t i = 0; i < gpu::kNumEmbeddedKernels; ++i) built.insert(gpu::kEmbeddedKernels[i].name);
  EXPECT_EQ(table, built);
}

TEST(ShaderStructure, ReflectionMatchesTheKernelTable) {
  for (const KernelInfo& k : kernels::kKernels) {
    SCOPED_TRACE(k.name);
    if (k.vulkan_only()) {  // SPIRV-Cross cannot read it; SpirvInterfaceMatchesTheKernelTable checks it
      std::printf("[ NO REFLECTION ] %s: Vulkan-only kernel (%s)\n", k.name,
                  k.int8_mma ? "cooperative matrices" : "int8 dot products");
      continue;
    }
    const nlohmann::json j = nlohmann::json::parse(embedded(k).reflection_json);
    ASSERT_EQ(j["entryPoints"].size(), 1u);
    EXPECT_EQ(j["entryPoints"][0]["name"], "main");
    EXPECT_EQ(j["entryPoints"][0]["mode"], "comp");
    EXPECT_EQ(j["entryPoints"][0]["workgroup_size"], nlohmann::json::array({k.local_size_x, 1, 1}));
    // Storage buffers: bindings 0..n-1 of set 0, access as the table says.
    std::vector<int> seen(static_cast<size_t>(k.num_bindings), 0);
    for (const auto& b : j.value("ssbos", nlohmann::json::array())) {
      const int binding = b["binding"], set = b["set"];
      EXPECT_EQ(set, 0);
      ASSERT_GE(binding, 0);
      ASSERT_LT(binding, k.num_bindings) << "binding " << binding << " is not in the table";
      ++seen[static_cast<size_t>(binding)];
      const bool ro = b.value("readonly", false), wo = b.value("writeonly", false);
      const Access want = k.access[binding];
      EXPECT_EQ(ro, want == Access::kRead) << "binding " << binding << " readonly";
      EXPECT_EQ(wo, want == Access::kWrite) << "binding " << binding << " writeonly";
    }
    for (int b = 0; b < k.num_bindings; ++b) EXPECT_EQ(seen[static_cast<size_t>(b)], 1) << "binding " << b;
    // Push constants: the table's field list, offsets and size.
    ASSERT_EQ(j["push_constants"].size(), 1u);
    const auto& members = j["types"][j["push_constants"][0]["type"].get<std::string>()]["members"];
    const std::vector<Field> fields = parse_fields(k.args_fields);
    ASSERT_EQ(members.size(), fields.size());
    uint32_t end = 0;
    for (size_t i = 0; i < fields.size(); ++i) {
      EXPECT_EQ(members[i]["name"], fields[i].name) << "member " << i;
      EXPECT_EQ(members[i]["offset"], fields[i].offset) << fields[i].name;
      end = fields[i].offset + fields[i].size;
    }
    EXPECT_EQ(end, k.args_size) << "push-constant block size";
  }
}

TEST(ShaderStructure, MslBindsBufferNToBindingNAndArgumentsTo30) {
  for (const KernelInfo& k : kernels::kKernels) {
    SCOPED_TRACE(k.name);
    if (k.vulkan_only()) {
      EXPECT_STREQ(embedded(k).msl, "") << "a Vulkan-only kernel has no MSL";
      std::printf("[ NO MSL ] %s: Vulkan-only kernel (Metal takes %s)\n", k.name,
                  k.int8_mma ? "qmm_tile" : "the row kernel without _dot4");
      continue;
    }
    const std::string msl = embedded(k).msl;
    const std::string entry = std::string("kernel void sb_") + k.name + "(";
    const size_t at = msl.find(entry);
    ASSERT_NE(at, std::string::npos) << "entry point sb_" << k.name;
    const std::string sig = msl.substr(at, msl.find('{', at) - at);
    for (int b = 0; b < k.num_bindings; ++b)
      EXPECT_NE(sig.find("[[buffer(" + std::to_string(b) + ")]]"), std::string::npos) << "buffer " << b;
    EXPECT_NE(sig.find("constant Args& args [[buffer(" + std::to_string(kernels::kMetalArgsBuffer) + ")]]"),
              std::string::npos)
        << sig;
    EXPECT_EQ(msl.find("fast::"), std::string::npos) << "fast-math builtins in the MSL";
    // The linear id must scale by the real workgroup size (common.glsl's sb_linear_id).
    EXPECT_EQ(msl.find("gl_NumWorkGroups.x * 1u"), std::string::npos) << "grid rows one workgroup wide";
    // A NoContraction multiply must keep a negative zero product (sb_shaderc's fix).
    EXPECT_EQ(msl.find("fma(l, r, T(0))"), std::string::npos) << "spvFMul loses the sign of -0";
  }
}

// A kernel's interface read straight from its SPIR-V words (independent of
// SPIRV-Cross, which cannot read the Vulkan-only kernels).
struct SpirvInterface {
  std::string entry;
  uint32_t local_size_x = 0;
  struct Buffer {
    uint32_t set = 0;
    bool readonly = true, writeonly = true;
  };
  std::map<uint32_t, Buffer> buffers;  // by binding
  std::vector<Field> push;             // name, offset, size (32-bit scalars and arrays of them)
};

SpirvInterface read_interface(const std::vector<uint32_t>& spv) {
  SpirvInterface out;
  std::map<uint32_t, std::map<uint32_t, std::string>> member_names;
  std::map<uint32_t, std::map<uint32_t, uint32_t>> member_offsets;
  std::map<uint32_t, std::set<uint32_t>> member_nonwritable, member_nonreadable;
  std::map<uint32_t, uint32_t> binding, set, constants, sizes, pointee;
  std::map<uint32_t, std::vector<uint32_t>> structs;
  std::set<uint32_t> nonwritable, nonreadable;
  std::vector<std::pair<uint32_t, uint32_t>> vars;  // (pointer type, id) of storage buffers and push constants
  auto str = [&](size_t at) { return std::string(reinterpret_cast<const char*>(spv.data() + at)); };
  for (size_t i = 5; i + 1 < spv.size() && (spv[i] >> 16) > 0; i += spv[i] >> 16) {
    const uint32_t op = spv[i] & 0xffff, wc = spv[i] >> 16;
    const uint32_t* w = spv.data() + i;
    if (op == spv::OpEntryPoint) out.entry = str(i + 3);
    if (op == spv::OpExecutionMode && w[2] == spv::ExecutionModeLocalSize) out.local_size_x = w[3];
    if (op == spv::OpMemberName) member_names[w[1]][w[2]] = str(i + 3);
    if (op == spv::OpDecorate && w[2] == spv::DecorationBinding) binding[w[1]] = w[3];
    if (op == spv::OpDecorate && w[2] == spv::DecorationDescriptorSet) set[w[1]] = w[3];
    if (op == spv::OpDecorate && w[2] == spv::DecorationNonWritable) nonwritable.insert(w[1]);
    if (op == spv::OpDecorate && w[2] == spv::DecorationNonReadable) nonreadable.insert(w[1]);
    if (op == spv::OpMemberDecorate && w[3] == spv::DecorationOffset) member_offsets[w[1]][w[2]] = w[4];
    if (op == spv::OpMemberDecorate && w[3] == spv::DecorationNonWritable) member_nonwritable[w[1]].insert(w[2]);
    if (op == spv::OpMemberDecorate && w[3] == spv::DecorationNonReadable) member_nonreadable[w[1]].insert(w[2]);
    if ((op == spv::OpTypeInt || op == spv::OpTypeFloat) && w[2] == 32) sizes[w[1]] = 4;
    if (op == spv::OpConstant && wc == 4) constants[w[2]] = w[3];
    if (op == spv::OpTypeArray && sizes.count(w[2]) && constants.count(w[3])) sizes[w[1]] = sizes[w[2]] * constants[w[3]];
    if (op == spv::OpTypeStruct) structs[w[1]].assign(w + 2, w + wc);
    if (op == spv::OpTypePointer) pointee[w[1]] = w[3];
    if (op == spv::OpVariable && (w[3] == spv::StorageClassStorageBuffer || w[3] == spv::StorageClassPushConstant))
      vars.push_back({w[1], w[2]});
  }
  for (auto [ptr, id] : vars) {
    const uint32_t type = pointee[ptr];
    const size_t members = structs[type].size();
    if (!binding.count(id)) {  // the push-constant block
      for (uint32_t m = 0; m < members; ++m)
        out.push.push_back({member_names[type][m], member_offsets[type][m], sizes[structs[type][m]]});
      continue;
    }
    SpirvInterface::Buffer b;
    b.set = set[id];
    b.readonly = nonwritable.count(id) || member_nonwritable[type].size() == members;
    b.writeonly = nonreadable.count(id) || member_nonreadable[type].size() == members;
    out.buffers[binding[id]] = b;
  }
  return out;
}

std::vector<uint32_t> words_of(const EmbeddedKernel& e) { return {e.spirv, e.spirv + e.spirv_words}; }

TEST(ShaderStructure, SpirvInterfaceMatchesTheKernelTable) {
  for (const KernelInfo& k : kernels::kKernels) {
    SCOPED_TRACE(k.name);
    const SpirvInterface in = read_interface(words_of(embedded(k)));
    EXPECT_EQ(in.entry, "main");
    EXPECT_EQ(in.local_size_x, k.local_size_x);
    ASSERT_EQ(in.buffers.size(), static_cast<size_t>(k.num_bindings));
    for (const auto& [b, buf] : in.buffers) {
      ASSERT_LT(b, static_cast<uint32_t>(k.num_bindings)) << "binding " << b << " is not in the table";
      EXPECT_EQ(buf.set, 0u);
      EXPECT_EQ(buf.readonly, k.access[b] == Access::kRead) << "binding " << b << " readonly";
      EXPECT_EQ(buf.writeonly, k.access[b] == Access::kWrite) << "binding " << b << " writeonly";
    }
    const std::vector<Field> fields = parse_fields(k.args_fields);
    ASSERT_EQ(in.push.size(), fields.size());
    for (size_t i = 0; i < fields.size(); ++i) {
      EXPECT_EQ(in.push[i].name, fields[i].name) << "member " << i;
      EXPECT_EQ(in.push[i].offset, fields[i].offset) << fields[i].name;
      EXPECT_EQ(in.push[i].size, fields[i].size) << fields[i].name;
    }
  }
}

// The exactness lint over one kernel's SPIR-V: no float comparisons (NVIDIA compares
// subnormals as zero; kernels compare bits), no builtin transcendentals, sqrt, fma, min/max/clamp (NaN rules
// differ), no division or remainder, no subgroup ops (their order depends on the
// device), every float add/sub/mul decorated NoContraction, and the RTE and
// SignedZeroInfNanPreserve execution modes declared for fp32.
std::vector<std::string> lint_spirv(const std::vector<uint32_t>& spv, bool divides = false) {
  static const std::set<uint32_t> forbidden_ext = {
      GLSLstd450Exp, GLSLstd450Exp2, GLSLstd450Log, GLSLstd450Log2, GLSLstd450Pow, GLSLstd450Tanh,
      GLSLstd450Sinh, GLSLstd450Cosh, GLSLstd450Sqrt, GLSLstd450InverseSqrt, GLSLstd450Fma, GLSLstd450Sin,
      GLSLstd450Cos, GLSLstd450Tan, GLSLstd450Atan, GLSLstd450Atan2, GLSLstd450FMin, GLSLstd450FMax,
      GLSLstd450FClamp, GLSLstd450NMin, GLSLstd450NMax, GLSLstd450NClamp, GLSLstd450FMix, GLSLstd450Ldexp};
  static const std::set<uint32_t> contractible = {spv::OpFAdd, spv::OpFSub, spv::OpFMul, spv::OpVectorTimesScalar,
                                                  spv::OpMatrixTimesScalar, spv::OpDot};
  std::vector<std::string> bad;
  if (spv.size() < 5 || spv[0] != spv::MagicNumber) return {"not SPIR-V"};
  std::set<uint32_t> no_contraction, glsl_sets, arith_ids;
  bool rte = false, sz = false;
  for (size_t i = 5; i < spv.size();) {
    const uint32_t op = spv[i] & 0xffff, wc = spv[i] >> 16;
    if (wc == 0 || i + wc > spv.size()) return {"truncated instruction"};
    const uint32_t* w = spv.data() + i;
    if (op == spv::OpExtInstImport && std::string(reinterpret_cast<const char*>(w + 2)) == "GLSL.std.450")
      glsl_sets.insert(w[1]);
    if (op == spv::OpExtInst && glsl_sets.count(w[3]) && forbidden_ext.count(w[4]))
      bad.push_back("GLSL.std.450 instruction " + std::to_string(w[4]));
    if (op == spv::OpDecorate && w[2] == spv::DecorationNoContraction) no_contraction.insert(w[1]);
    if (op == spv::OpExecutionMode && wc >= 4 && w[3] == 32) {
      rte |= w[2] == spv::ExecutionModeRoundingModeRTE;
      sz |= w[2] == spv::ExecutionModeSignedZeroInfNanPreserve;
    }
    if ((op == spv::OpFDiv && !divides) || op == spv::OpFRem || op == spv::OpFMod)
      bad.push_back("division opcode " + std::to_string(op));
    if (op == spv::OpFDiv) arith_ids.insert(w[2]);
    if (op >= spv::OpFOrdEqual && op <= spv::OpFUnordGreaterThanEqual)  // compare bits instead (common.glsl)
      bad.push_back("float comparison opcode " + std::to_string(op));
    if (op == spv::OpIsNan || op == spv::OpIsInf) bad.push_back("float classification opcode " + std::to_string(op));
    if (op >= spv::OpGroupNonUniformElect && op <= spv::OpGroupNonUniformQuadSwap)
      bad.push_back("subgroup opcode " + std::to_string(op));
    if (contractible.count(op)) arith_ids.insert(w[2]);
    i += wc;
  }
  for (uint32_t id : arith_ids)
    if (!no_contraction.count(id)) bad.push_back("float op %" + std::to_string(id) + " lacks NoContraction");
  if (!rte) bad.push_back("RoundingModeRTE 32 not declared");
  if (!sz) bad.push_back("SignedZeroInfNanPreserve 32 not declared");
  return bad;
}

TEST(ShaderStructure, ExactKernelsPassTheSpirvLint) {
  for (const KernelInfo& k : kernels::kKernels) {
    if (!k.exact) continue;
    SCOPED_TRACE(k.name);
    for (const std::string& problem : lint_spirv(words_of(embedded(k)), k.divides)) ADD_FAILURE() << problem;
  }
}

// Only the kernels the table marks as dividing may contain OpFDiv.
TEST(ShaderStructure, OnlyDividingKernelsDivide) {
  for (const KernelInfo& k : kernels::kKernels) {
    SCOPED_TRACE(k.name);
    const std::vector<uint32_t> spv = words_of(embedded(k));
    bool has_div = false;
    for (size_t i = 5; i < spv.size(); i += spv[i] >> 16) has_div |= (spv[i] & 0xffff) == spv::OpFDiv;
    EXPECT_EQ(has_div, k.divides);
  }
}

// The lint catches what it is for: a kernel with its NoContraction decorations and
// its RTE mode edited away fails.
TEST(ShaderStructure, LintFlagsContractibleOpsAndMissingModes) {
  std::vector<uint32_t> spv = words_of(embedded(*kernels::find_kernel("glu")));
  ASSERT_TRUE(lint_spirv(spv).empty());
  for (size_t i = 5; i < spv.size(); i += spv[i] >> 16) {
    const uint32_t op = spv[i] & 0xffff;
    if (op == spv::OpDecorate && spv[i + 2] == spv::DecorationNoContraction) spv[i + 2] = spv::DecorationRelaxedPrecision;
    if (op == spv::OpExecutionMode && spv[i + 2] == spv::ExecutionModeRoundingModeRTE)
      spv[i + 2] = spv::ExecutionModeRoundingModeRTZ;
  }
  const std::vector<std::string> bad = lint_spirv(spv);
  ASSERT_GE(bad.size(), 2u);
  EXPECT_NE(bad.front().find("lacks NoContraction"), std::string::npos) << bad.front();
  EXPECT_EQ(bad.back(), "RoundingModeRTE 32 not declared");
}

// CI sets SWITCHBOARD_REQUIRE_VULKAN=1 (lavapipe), so the Vulkan cases of the op
// harness cannot silently turn into skips.
TEST(ShaderStructure, VulkanDeviceOpensWhenRequired) {
  const char* req = std::getenv("SWITCHBOARD_REQUIRE_VULKAN");
  ProgramBuilder b;
  b.output("y", b.neg(b.input("x", DType::kF32, {4})));
  auto program = Program::from_bytes(b.serialize().value(), "structure_test").value();
  auto s = Session::create(program, SessionOptions{"vulkan"});
  if (!s.is_ok()) {
    EXPECT_FALSE(req && *req == '1') << s.status().to_string();
    std::printf("[ DEVICE SKIPPED ] vulkan: %s\n", s.status().to_string().c_str());
    return;
  }
  EXPECT_EQ((*s)->device_description().rfind("vulkan:", 0), 0u) << (*s)->device_description();
  ASSERT_TRUE((*s)->set_input("x", Tensor::from_vector(DType::kF32, {4}, std::vector<float>{1, -2, 0, 3}).value()).is_ok());
  ASSERT_TRUE((*s)->execute().is_ok());
  EXPECT_EQ((*s)->output("y").value().to_doubles(), (std::vector<double>{-1, 2, -0.0, -3}));
}

}  // namespace
}  // namespace switchboard
