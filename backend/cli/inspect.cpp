// `switchboard inspect FILE`: a readable listing of a program file.
#include <cstdio>
#include <cstring>
#include <map>

#include "cli.h"
#include "op_info.h"
#include "program_impl.h"

namespace switchboard::cli {
namespace {

std::string slot_list(fb::OpNodeUnion& op) {
  std::string s;
  for_each_slot(op, [&](const SlotRef& r) {
    s += strformat(" %s%s%s=%c%u", r.is_write ? "->" : "", r.field, r.element >= 0 ? strformat("[%d]", r.element).c_str() : "",
                   r.is_tensor ? 't' : 'v', r.idx ? *r.idx : 0);
  });
  if (op.type == fb::OpNode::IfNode) {
    const auto* n = op.AsIfNode();
    if (!n->cond->is_vid) s += strformat(" cond=%lld", static_cast<long long>(n->cond->literal));
    s += strformat(" then=chain %u else=chain %u", n->then_chain, n->else_chain);
  }
  return s;
}

void print_program(const FileHeader& h, size_t file_size, fb::ProgramT& p) {
  std::printf("header: magic SWBP, format_version %u, flatbuffer at %llu (%llu bytes), file %zu bytes\n",
              h.format_version, (unsigned long long)h.flatbuffer_offset, (unsigned long long)h.flatbuffer_size,
              file_size);
  std::printf("schema version %u; %u tensor slots, %u value slots; %zu chains (main %u, init %d)\n", p.version,
              p.num_tensor_slots, p.num_value_slots, p.chains.size(), p.main_chain, p.init_chain);
  auto io = [&](const char* what, const std::vector<std::unique_ptr<fb::IoSlotT>>& list) {
    for (const auto& e : list)
      std::printf("%s %-24s %s\n", what, e->name.c_str(),
                  e->kind == fb::SlotKind::Value ? strformat("v%u (int)", e->idx).c_str()
                  : strformat("t%u %s %s", e->idx, dtype_name(static_cast<DType>(p.tensor_meta[e->idx]->dtype)),
                              dims_str(p.tensor_meta[e->idx]->shape).c_str()).c_str());
  };
  io("input ", p.inputs);
  io("output", p.outputs);
  for (const auto& m : p.mutable_buffers) std::printf("buffer %-24s t%u\n", m->name.c_str(), m->tid->idx());
  for (const auto& c : p.constants)
    std::printf("const  %-24s t%u %s %s\n", c->name.c_str(), c->tid->idx(),
                dtype_name(static_cast<DType>(p.tensor_meta[c->tid->idx()]->dtype)),
                dims_str(p.tensor_meta[c->tid->idx()]->shape).c_str());
  for (const auto& a : p.attributes) std::printf("attr   %-24s %lld\n", a->name.c_str(), (long long)a->value);
  std::printf("tensor slots:\n");
  for (size_t i = 0; i < p.tensor_meta.size(); ++i)
    std::printf("  t%-4zu %-5s %s\n", i, dtype_name(static_cast<DType>(p.tensor_meta[i]->dtype)),
                dims_str(p.tensor_meta[i]->shape).c_str());
  std::map<std::string, int> counts;
  for (size_t c = 0; c < p.chains.size(); ++c) {
    std::printf("chain %zu%s (%zu instructions):\n", c, c == p.main_chain ? " [main]" : (int64_t)c == p.init_chain ? " [init]" : "",
                p.chains[c]->instructions.size());
    for (size_t i = 0; i < p.chains[c]->instructions.size(); ++i) {
      fb::OpNodeUnion& op = p.chains[c]->instructions[i]->op;
      ++counts[op_name(op.type)];
      std::printf("  [%zu] %s%s\n", i, op_name(op.type), slot_list(op).c_str());
    }
  }
  std::printf("node counts:");
  for (const auto& [name, n] : counts) std::printf(" %s=%d", name.c_str(), n);
  std::printf("\n");
}

}  // namespace

int run_inspect(const std::string& path) {
  auto bytes = read_file(path);
  if (!bytes) {
    std::fprintf(stderr, "switchboard inspect: %s\n", bytes.status().to_string().c_str());
    return 1;
  }
  auto ir = parse_program(*bytes);
  if (!ir) {
    std::fprintf(stderr, "switchboard inspect: %s: %s\n", path.c_str(), ir.status().to_string().c_str());
    return 1;
  }
  FileHeader h;
  std::memcpy(&h, bytes->data(), sizeof h);
  print_program(h, bytes->size(), **ir);
  return 0;
}

}  // namespace switchboard::cli
