// libFuzzer target: untrusted model descriptions. Odd first byte: a bit map JSON; even:
// a Hugging Face config.json, and when it parses, a small one is built into a program.
#include <cstddef>
#include <cstdint>
#include <string>

#include "switchboard/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace switchboard;
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    models::ExportFormat f;
    (void)models::parse_bit_map(text, "fuzz.json", &f);
    return 0;
  }
  auto c = models::parse_hf_config_text(text, "fuzz/config.json");
  if (!c.is_ok()) return 0;
  // Building is linear in the sizes; keep it to configs that build in milliseconds.
  if (c->layers > 4 || c->hidden > 256 || c->vocab > 1024 || c->experts > 64 || c->heads * c->head_dim > 1024) return 0;
  c->max_seq = 16;
  ProgramBuilder b;
  (void)models::build_decoder(*c, models::ExportFormat{}, b);
  (void)b.serialize();
  return 0;
}
