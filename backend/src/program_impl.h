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
inline constexpr uint32_t kSchemaVersion = 4;
// Binary framing version in the file header.
inline constexpr uint32_t kFormatVersion = 1;
inline constexpr char kMagic[4] = {'S', 'W', 'B', 'P'};
inline constexpr uint32_t kMaxIfDepth = 16;

// 32-byte file header that precedes the FlatBuffer (all little endian).
struct FileHeader {
  char magic[4];
  uint32_t header_size;      // 32
  uint32_t format_version;   // kFormatVersion
  uint32_t flags;            // 0
  uint64_t flatbuffer_offset;
  uint64_t flatbuffer_size;
};
static_assert(sizeof(FileHeader) == 32, "file header is 32 bytes on the wire");

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
};

}  // namespace detail

// Header check + FlatBuffer verifier + unpack + semantic validation.
Result<std::unique_ptr<fb::ProgramT>> parse_program(std::span<const uint8_t> bytes);
// The validator on its own (also run by the builder before serializing).
Status validate_program(const fb::ProgramT& p);
// Header + FlatBuffer bytes for `p` (not validated here).
std::vector<uint8_t> serialize_program(const fb::ProgramT& p);
// Reads a whole file; errors name the path.
Result<std::vector<uint8_t>> read_file(const std::string& path);

// Shared helpers over tensor metadata.
std::string dims_str(const std::vector<std::unique_ptr<fb::DimT>>& dims);
// True when `s` fits the declared dims (rank, static sizes, dynamic bounds).
bool shape_fits(const Shape& s, const std::vector<std::unique_ptr<fb::DimT>>& dims);

}  // namespace switchboard
