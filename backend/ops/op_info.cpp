#include "op_info.h"

namespace switchboard {

namespace {

using Fn = std::function<void(const SlotRef&)>;

// A required or optional tensor slot held as a table field.
void tensor(const Fn& fn, const char* field, std::unique_ptr<fb::Tid>& t, bool write, bool optional) {
  if (!t && optional) return;
  fn(SlotRef{true, write, field, -1, t ? reinterpret_cast<uint32_t*>(t.get()) : nullptr});
}

void value_out(const Fn& fn, const char* field, std::unique_ptr<fb::Vid>& v) {
  fn(SlotRef{false, true, field, -1, v ? reinterpret_cast<uint32_t*>(v.get()) : nullptr});
}

// An IntOrVid reads a value slot only when it is not a literal.
void int_or_vid(const Fn& fn, const char* field, int element, std::unique_ptr<fb::IntOrVidT>& v) {
  if (!v || !v->is_vid) return;
  fn(SlotRef{false, false, field, element, v->vid ? reinterpret_cast<uint32_t*>(v->vid.get()) : nullptr});
}

void tensor_list(const Fn& fn, const char* field, std::vector<fb::Tid>& ts, bool write) {
  for (size_t i = 0; i < ts.size(); ++i)
    fn(SlotRef{true, write, field, static_cast<int>(i), reinterpret_cast<uint32_t*>(&ts[i])});
}

}  // namespace

static_assert(sizeof(fb::Tid) == sizeof(uint32_t) && sizeof(fb::Vid) == sizeof(uint32_t),
              "slot ids are patched in place through a uint32_t pointer");

// op_name() and for_each_slot(), one case per op, written by the build from the schema.
#include "op_info_generated.inc"

}  // namespace switchboard
