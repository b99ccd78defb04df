// The in-memory form of a loaded program, shared by the loader, interpreter,
// builder (serialization) and CLI. Not part of the public API.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "program_generated.h"
#include "safetensors.h"
#include "switchboard/switchboard.h"

namespace switchboard {

// Schema version written by this build and the newest the loader accepts.
inline constexpr uint32_t kSchemaVersion = 8;
// Binary framing version in the file header: 1 (32 bytes, no checksums) or 2 (64 bytes).
inline constexpr uint32_t kFormatVersion = 2;
inline constexpr char kMagic[4] = {'S', 'W', 'B', 'P'};
inline constexpr uint32_t kMaxIfDepth = 16;

// File header that precedes the FlatBuffer (all little endian): 32 bytes in format 1, 64 in
// format 2, which adds the checksums (schema/README.md).
struct FileHeader {
  char magic[4];
  uint32_t header_size;      // 32 or 64
  uint32_t format_version;   // 1 or 2
  uint32_t flags;            // kHeaderHasWeights
  uint64_t flatbuffer_offset;
  uint64_t flatbuffer_size;
  // Format 2 (zero when read from a format 1 file):
  uint64_t checksum_xxh3;        // of the header (this field as 0) and the FlatBuffer; every load
  uint64_t weights_bytes;        // the weights file it was exported with: size,
  uint64_t weights_header_xxh3;  // hash of its header (checked at load),
  uint64_t weights_xxh3;         // hash of all of it (checked on request: inspect --verify)
};
static_assert(sizeof(FileHeader) == 64, "format 2 header is 64 bytes on the wire");
inline constexpr uint32_t kHeaderV1Bytes = 32;
inline constexpr uint32_t kHeaderHasWeights = 1;

// The weights record of a format 2 header.
struct WeightsStamp {
  WeightsFingerprint fingerprint;
  uint64_t content_xxh3 = 0;
};

enum class SlotRole : uint8_t { kTemp, kConstant, kInput, kMutable };

namespace detail {

struct ProgramImpl {
  std::string origin;  // file path or label, for messages
  std::unique_ptr<fb::ProgramT> ir;
  std::vector<SlotRole> roles;      // per tensor slot
  std::vector<Tensor> constants;    // per tensor slot; defined for resolved constants
  bool constants_resolved = false;
  std::vector<IoInfo> inputs, outputs;
  std::vector<std::shared_ptr<SafetensorsFile>> weights;
  FileHeader header{};  // as read (zeros past a format 1 header; all zeros from memory)
};

}  // namespace detail

// Header check (FlatBuffer checksum included) + FlatBuffer verifier + unpack + semantic
// validation; the header read goes to `header` when given.
Result<std::unique_ptr<fb::ProgramT>> parse_program(std::span<const uint8_t> bytes, FileHeader* header = nullptr);
// The validator on its own (also run by the builder before serializing).
Status validate_program(const fb::ProgramT& p);
// Header + FlatBuffer bytes for `p` (not validated here), format 2.
std::vector<uint8_t> serialize_program(const fb::ProgramT& p);
// The format 2 checksum: XXH3-64 of the header with checksum_xxh3 = 0, then the FlatBuffer.
uint64_t program_checksum(const FileHeader& h, std::span<const uint8_t> body);
// Records `w` in the header of a serialized program (and the checksum again).
void stamp_weights(std::vector<uint8_t>& file, const WeightsStamp& w);
// The record of the weights file at `path` (its header, and every byte read and hashed).
Result<WeightsStamp> weights_stamp(const std::string& path);
// Checks the program's weights record against `file`; with `full`, also its content hash.
// Errors name the program and the weights file.
Status check_weights_record(const detail::ProgramImpl& p, const SafetensorsFile& file, bool full);
// Reads a whole file; errors name the path.
Result<std::vector<uint8_t>> read_file(const std::string& path);

// Shared helpers over tensor metadata.
std::string dims_str(const std::vector<std::unique_ptr<fb::DimT>>& dims);
// True when `s` fits the declared dims (rank, static sizes, dynamic bounds).
bool shape_fits(const Shape& s, const std::vector<std::unique_ptr<fb::DimT>>& dims);

}  // namespace switchboard
