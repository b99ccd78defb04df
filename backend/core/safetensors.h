// Safetensors files: read (memory-mapped, validated, zero-copy where aligned)
// and write. Layout: u64 LE header length N, N bytes of JSON, then the data.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "switchboard/status.h"
#include "switchboard/tensor.h"

namespace switchboard {

struct SafetensorsEntry {
  DType dtype;
  Shape shape;
  uint64_t begin = 0;  // byte offsets relative to the start of the data section
  uint64_t end = 0;
};

class SafetensorsFile {
 public:
  // Maps and validates `path`: header length inside the file, JSON well formed,
  // every entry with a known dtype, a shape, and data_offsets inside the data
  // section whose size equals numel * dtype size; entries never overlap.
  // Errors name the file and the key: "w.safetensors: tensor 'a.b': ...".
  static Result<std::shared_ptr<SafetensorsFile>> open(const std::string& path);
  // Same checks over bytes already in memory (used by the fuzzer and tests).
  static Result<std::shared_ptr<SafetensorsFile>> from_bytes(std::vector<uint8_t> bytes, std::string origin);

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor's bytes: zero-copy (shares the mapping) when the data pointer is
  // aligned for its dtype, otherwise an aligned copy. NotFound if absent.
  Result<Tensor> tensor(const std::string& name) const;

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

 private:
  SafetensorsFile() = default;
  Status parse();

  std::string path_;
  const uint8_t* base_ = nullptr;  // whole file
  size_t size_ = 0;
  size_t data_start_ = 0;
  void* map_ = nullptr;             // mmap'd region, or null when bytes_ holds the data
  std::vector<uint8_t> bytes_;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
  // Set by open/from_bytes; zero-copy tensors hold a shared_ptr to *this made from it
  // (a weak_ptr, since a shared_ptr to itself would never be freed).
  std::weak_ptr<const SafetensorsFile> self_;
  static Result<std::shared_ptr<SafetensorsFile>> finish(std::shared_ptr<SafetensorsFile> file);
};

// Safetensors dtype names ("F32", "BF16", ...).
const char* safetensors_dtype_name(DType t);

// Writes `tensors` contiguously (the format allows no holes), ordered by dtype
// size descending so each starts aligned to its element size; the JSON header is
// space-padded so the data section starts 64-byte aligned. Writes to
// `path + ".tmp"` then renames, so a failure never leaves a half-written file.
Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace switchboard
