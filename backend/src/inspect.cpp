// describe_program_file (switchboard inspect): a readable listing of a program file.
#include <cstdio>
#include <cstring>
#include <map>

#include "op_info.h"
#include "program_impl.h"
#include "switchboard/switchboard.h"

namespace switchboard {
namespace {

std::string slot_list(fb::OpNodeUnion& op) {
  std::string s;
  for_each_slot(op, [&](const SlotRef& r) {
    s += strformat(" %s%s%s=%c%u", r.is_write ? "->" : "", r.field,
                   r.element >= 0 ? strformat("[%d]", r.element).c_str() : "", r.is_tensor ? 't' : 'v',
                   r.idx ? *r.idx : 0);
  });
  if (op.type == fb::OpNode::IfNode) {
    const auto* n = op.AsIfNode();
    if (!n->cond->is_vid) s += strformat(" cond=%lld", static_cast<long long>(n->cond->literal));
    s += strformat(" then=chain %u else=chain %u", n->then_chain, n->else_chain);
  }
  return s;
}

void print_program(std::string& out, const FileHeader& h, size_t file_size, fb::ProgramT& p) {
  out += strformat("header: magic SWBP, format_version %u, flatbuffer at %llu (%llu bytes), file %zu bytes\n",
                   h.format_version, (unsigned long long)h.flatbuffer_offset, (unsigned long long)h.flatbuffer_size,
                   file_size);
  if (h.format_version >= 2)
    out += strformat("checksum xxh3 %016llx (header and FlatBuffer, checked)\n", (unsigned long long)h.checksum_xxh3);
  if (h.flags & kHeaderHasWeights)
    out += strformat("weights: exported with a file of %llu bytes, header xxh3 %016llx, content xxh3 %016llx\n",
                     (unsigned long long)h.weights_bytes, (unsigned long long)h.weights_header_xxh3,
                     (unsigned long long)h.weights_xxh3);
  else
    out += "weights: no record (not written by export)\n";
  out += strformat("schema version %u; %u tensor slots, %u value slots; %zu chains (main %u, init %d)\n", p.version,
                   p.num_tensor_slots, p.num_value_slots, p.chains.size(), p.main_chain, p.init_chain);
  auto io = [&](const char* what, const std::vector<std::unique_ptr<fb::IoSlotT>>& list) {
    for (const auto& e : list)
      out +=
          strformat("%s %-24s %s\n", what, e->name.c_str(),
                    e->kind == fb::SlotKind::Value
                        ? strformat("v%u (int)", e->idx).c_str()
                        : strformat("t%u %s %s", e->idx, dtype_name(static_cast<DType>(p.tensor_meta[e->idx]->dtype)),
                                    dims_str(p.tensor_meta[e->idx]->shape).c_str())
                              .c_str());
  };
  io("input ", p.inputs);
  io("output", p.outputs);
  for (const auto& m : p.mutable_buffers) out += strformat("buffer %-24s t%u\n", m->name.c_str(), m->tid->idx());
  for (const auto& c : p.constants)
    out += strformat("const  %-24s t%u %s %s\n", c->name.c_str(), c->tid->idx(),
                     dtype_name(static_cast<DType>(p.tensor_meta[c->tid->idx()]->dtype)),
                     dims_str(p.tensor_meta[c->tid->idx()]->shape).c_str());
  for (const auto& a : p.attributes) out += strformat("attr   %-24s %lld\n", a->name.c_str(), (long long)a->value);
  out += strformat("tensor slots:\n");
  for (size_t i = 0; i < p.tensor_meta.size(); ++i)
    out += strformat("  t%-4zu %-5s %s\n", i, dtype_name(static_cast<DType>(p.tensor_meta[i]->dtype)),
                     dims_str(p.tensor_meta[i]->shape).c_str());
  std::map<std::string, int> counts;
  for (size_t c = 0; c < p.chains.size(); ++c) {
    out += strformat("chain %zu%s (%zu instructions):\n", c,
                     c == p.main_chain            ? " [main]"
                     : (int64_t)c == p.init_chain ? " [init]"
                                                  : "",
                     p.chains[c]->instructions.size());
    for (size_t i = 0; i < p.chains[c]->instructions.size(); ++i) {
      fb::OpNodeUnion& op = p.chains[c]->instructions[i]->op;
      ++counts[op_name(op.type)];
      out += strformat("  [%zu] %s%s\n", i, op_name(op.type), slot_list(op).c_str());
    }
  }
  out += strformat("node counts:");
  for (const auto& [name, n] : counts) out += strformat(" %s=%d", name.c_str(), n);
  out += strformat("\n");
}

}  // namespace

Result<std::string> describe_program_file(const std::string& path) {
  SB_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, read_file(path));
  FileHeader h{};
  auto ir = parse_program(bytes, &h);
  if (!ir) return Status(ir.status().code(), path + ": " + ir.status().message());
  std::string out;
  print_program(out, h, bytes.size(), **ir);
  return out;
}

}  // namespace switchboard
