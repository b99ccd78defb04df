// Safetensors files: read (memory-mapped, validated, zero-copy where aligned)
// and write. Layout: u64 LE header length N, N bytes of JSON, then the data.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "switchboard/status.h"
#include "switchboard/switchboard.h"
#include "switchboard/tensor.h"

namespace switchboard {

struct SafetensorsEntry {
  DType dtype;
  Shape shape;
  uint64_t begin = 0;  // byte offsets relative to the start of the data section
  uint64_t end = 0;
};

class MappedFile;

// What a program file records about the weights file it was exported with.
struct WeightsFingerprint {
  uint64_t file_bytes = 0;
  uint64_t header_xxh3 = 0;  // of the length prefix and the JSON header
  bool operator==(const WeightsFingerprint&) const = default;
};

class SafetensorsFile {
 public:
  // Maps (or reads) and validates `path`: header length inside the file, JSON well
  // formed, every entry with a known dtype, a shape, and data_offsets inside the data
  // section whose size equals numel * dtype size; entries never overlap.
  // Errors name the file and the key: "w.safetensors: tensor 'a.b': ...".
  static Result<std::shared_ptr<SafetensorsFile>> open(const std::string& path,
                                                       WeightsAccess access = WeightsAccess::kMap);
  // Same checks over bytes already in memory (used by the fuzzer and tests).
  static Result<std::shared_ptr<SafetensorsFile>> from_bytes(std::vector<uint8_t> bytes, std::string origin);

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor's bytes: zero-copy (shares the mapping) when the data pointer is
  // aligned for its dtype, otherwise an aligned copy. NotFound if absent.
  Result<Tensor> tensor(const std::string& name) const;

  WeightsFingerprint fingerprint() const;
  // XXH3-64 of every byte of the file (reads all of it).
  uint64_t content_xxh3() const;
  // True once a read of the mapping faulted because the file shrank: the bytes read since
  // are zeros, and anything computed from them is wrong.
  bool changed_on_disk() const;

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
  std::unique_ptr<MappedFile> map_;  // or null when bytes_ holds the data
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

// A tensor a writer will receive: its name, dtype and shape.
struct TensorSpec {
  std::string name;
  DType dtype;
  Shape shape;
};

// Writes a safetensors file one tensor at a time, so a model larger than memory can be
// converted: the header is laid out from the specs up front (largest element first, so each
// tensor starts aligned to its element size; the JSON space-padded so the data starts
// 64-byte aligned), each tensor is written at its place as it arrives (in any order, each
// exactly once, with the declared dtype and shape) and may be released at once. Data goes to
// `path + ".tmp"`; finish() renames it into place, so a failure never leaves a partial file.
class SafetensorsWriter {
 public:
  static Result<std::unique_ptr<SafetensorsWriter>> create(const std::string& path, const std::vector<TensorSpec>& specs,
                                                           const std::map<std::string, std::string>& metadata = {});
  Status write(const std::string& name, const Tensor& t);
  // Fails unless every declared tensor was written; then the file is complete at `path`.
  Status finish();
  // Removes the temporary file unless finish() succeeded.
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

 private:
  SafetensorsWriter() = default;
  struct Place {
    DType dtype;
    Shape shape;
    uint64_t offset = 0, bytes = 0;
    bool written = false;
  };
  std::string path_, tmp_;
  int fd_ = -1;
  std::map<std::string, Place> places_;
  bool finished_ = false;
};

// The writer over tensors already in memory.
Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace switchboard
