// libFuzzer target: safetensors bytes -> header validation, then every tensor's
// bytes are materialized (zero-copy or aligned copy) and read once.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace switchboard;
  auto file = SafetensorsFile::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz.safetensors");
  if (!file.is_ok()) return 0;
  for (const auto& [name, entry] : (*file)->entries()) {
    auto t = (*file)->tensor(name);
    if (!t.is_ok() || t->nbytes() == 0) continue;
    // Touch the first and last byte so ASan checks the data range the entry claims.
    const auto* p = static_cast<const volatile uint8_t*>(t->data());
    (void)p[0];
    (void)p[t->nbytes() - 1];
  }
  return 0;
}
