// Content hashes for integrity checks: XXH3-64 (Debian's libxxhash), fast enough to hash a
// 17 GB weights file at memory speed. Not a cryptographic hash: it finds corruption and
// mismatched files, not tampering.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace switchboard {

uint64_t xxh3_64(const void* data, size_t size);

// The same hash over bytes given in pieces (in order).
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void update(const void* data, size_t size);
  uint64_t digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace switchboard
