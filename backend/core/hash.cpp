#include "hash.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace switchboard {

uint64_t xxh3_64(const void* data, size_t size) { return XXH3_64bits(data, size); }

struct Xxh3Stream::State {
  XXH3_state_t s;
};

Xxh3Stream::Xxh3Stream() : state_(std::make_unique<State>()) { XXH3_64bits_reset(&state_->s); }
Xxh3Stream::~Xxh3Stream() = default;
void Xxh3Stream::update(const void* data, size_t size) { XXH3_64bits_update(&state_->s, data, size); }
uint64_t Xxh3Stream::digest() const { return XXH3_64bits_digest(&state_->s); }

}  // namespace switchboard
