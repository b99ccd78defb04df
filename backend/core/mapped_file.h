// Read-only mappings of weights files that another process may truncate while we run.
// A read past the file's new end raises SIGBUS; inside a guarded mapping our handler maps
// zero pages over the rest of the mapping and flags it, so the read completes (with zeros)
// and the session reports the file as changed instead of the process dying. Faults
// elsewhere go to the handler that was installed before ours (by default: the process dies).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "switchboard/status.h"

namespace switchboard {

class MappedFile {
 public:
  // Maps `size` bytes of the open descriptor `fd` (which the caller still owns).
  static Result<std::unique_ptr<MappedFile>> map(int fd, size_t size, const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return static_cast<const uint8_t*>(base_); }
  size_t size() const { return size_; }
  // True once a read faulted (the file shrank under the mapping): data read since is zeros.
  bool faulted() const;
  // False when every guard slot was taken (the mapping then works unguarded).
  bool guarded() const { return slot_ >= 0; }
  // Drops the whole pages of [p, p + bytes) from the process's memory where they lie in a
  // live guarded mapping (they read back from the file if touched again); elsewhere nothing.
  // For weights a kernel has copied into its own layout. Returns the bytes dropped.
  static size_t release_pages(const void* p, size_t bytes);

 private:
  MappedFile() = default;
  void* base_ = nullptr;
  size_t size_ = 0;
  int slot_ = -1;
};

}  // namespace switchboard
