// Binary framing of a program file: a 32-byte header, then the FlatBuffer.
#include <cstdio>
#include <cstring>

#include <flatbuffers/flatbuffers.h>
#include "file_io.h"
#include "hash.h"
#include "log.h"
#include "program_impl.h"

namespace switchboard {

static_assert(static_cast<int>(fb::DType::Bool) == static_cast<int>(DType::kBool) &&
                  static_cast<int>(fb::DType::BF16) == static_cast<int>(DType::kBF16),
              "public DType mirrors the schema's DType");

// Program files hold the graph only (weights live in the weights file): 1 GiB is far above
// any real one, and bounds what a hostile path (/dev/zero, a huge file) can make us read.
constexpr uint64_t kMaxProgramBytes = uint64_t{1} << 30;

Result<std::vector<uint8_t>> read_file(const std::string& path) {
  return read_regular_file(path, kMaxProgramBytes, "program");
}

std::vector<uint8_t> serialize_program(const fb::ProgramT& p) {
  flatbuffers::FlatBufferBuilder fbb;
  // Write every field: a float equal to its default only by == (-0.0 vs 0.0) must keep its sign.
  fbb.ForceDefaults(true);
  fbb.Finish(fb::Program::Pack(fbb, &p), fb::ProgramIdentifier());
  FileHeader h{};
  std::memcpy(h.magic, kMagic, 4);
  h.header_size = sizeof(FileHeader);
  h.format_version = kFormatVersion;
  h.flatbuffer_offset = sizeof(FileHeader);
  h.flatbuffer_size = fbb.GetSize();
  std::vector<uint8_t> out(sizeof(FileHeader) + fbb.GetSize());
  std::memcpy(out.data(), &h, sizeof h);
  std::memcpy(out.data() + sizeof h, fbb.GetBufferPointer(), fbb.GetSize());
  h.checksum_xxh3 = program_checksum(h, std::span<const uint8_t>(out).subspan(sizeof h));
  std::memcpy(out.data(), &h, sizeof h);
  return out;
}

uint64_t program_checksum(const FileHeader& h, std::span<const uint8_t> body) {
  FileHeader zeroed = h;
  zeroed.checksum_xxh3 = 0;
  Xxh3Stream s;
  s.update(&zeroed, sizeof zeroed);
  s.update(body.data(), body.size());
  return s.digest();
}

void stamp_weights(std::vector<uint8_t>& file, const WeightsStamp& w) {
  FileHeader h;
  std::memcpy(&h, file.data(), sizeof h);
  h.flags |= kHeaderHasWeights;
  h.weights_bytes = w.fingerprint.file_bytes;
  h.weights_header_xxh3 = w.fingerprint.header_xxh3;
  h.weights_xxh3 = w.content_xxh3;
  h.checksum_xxh3 = program_checksum(h, std::span<const uint8_t>(file).subspan(h.flatbuffer_offset, h.flatbuffer_size));
  std::memcpy(file.data(), &h, sizeof h);
}

Result<WeightsStamp> weights_stamp(const std::string& path) {
  SB_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(path));
  SB_ASSIGN_OR_RETURN(uint64_t content, xxh3_file(path));
  return WeightsStamp{file->fingerprint(), content};
}

static Result<std::span<const uint8_t>> check_header(std::span<const uint8_t> bytes, FileHeader* out) {
  SB_CHECK_OR_RETURN(bytes.size() >= kHeaderV1Bytes, StatusCode::kInvalidProgram,
                     "header: file is %zu bytes, shorter than the %u-byte header", bytes.size(), kHeaderV1Bytes);
  FileHeader h{};
  std::memcpy(&h, bytes.data(), kHeaderV1Bytes);
  SB_CHECK_OR_RETURN(std::memcmp(h.magic, kMagic, 4) == 0, StatusCode::kInvalidProgram,
                     "header.magic: %02x %02x %02x %02x is not \"SWBP\" (not a Switchboard program)",
                     bytes[0], bytes[1], bytes[2], bytes[3]);
  SB_CHECK_OR_RETURN(h.format_version >= 1 && h.format_version <= kFormatVersion, StatusCode::kInvalidProgram,
                     "header.format_version: %u is not supported (this build reads 1..%u)", h.format_version,
                     kFormatVersion);
  const size_t want = h.format_version == 1 ? kHeaderV1Bytes : sizeof(FileHeader);
  SB_CHECK_OR_RETURN(h.header_size == want, StatusCode::kInvalidProgram,
                     "header.header_size: %u, expected %zu for format %u", h.header_size, want, h.format_version);
  SB_CHECK_OR_RETURN(bytes.size() >= want, StatusCode::kInvalidProgram,
                     "header: file is %zu bytes, shorter than the %zu-byte header", bytes.size(), want);
  std::memcpy(&h, bytes.data(), want);
  SB_CHECK_OR_RETURN(h.flatbuffer_offset >= want && h.flatbuffer_offset <= bytes.size() &&
                         h.flatbuffer_size <= bytes.size() - h.flatbuffer_offset,
                     StatusCode::kInvalidProgram,
                     "header: flatbuffer [%llu, +%llu) is outside the %zu-byte file",
                     static_cast<unsigned long long>(h.flatbuffer_offset),
                     static_cast<unsigned long long>(h.flatbuffer_size), bytes.size());
  const auto body = bytes.subspan(h.flatbuffer_offset, h.flatbuffer_size);
  if (h.format_version >= 2) {
    SB_CHECK_OR_RETURN(h.flags <= kHeaderHasWeights, StatusCode::kInvalidProgram, "header.flags: %#x has unknown bits",
                       h.flags);
    const uint64_t sum = program_checksum(h, body);
    SB_CHECK_OR_RETURN(sum == h.checksum_xxh3, StatusCode::kInvalidProgram,
                       "header.checksum_xxh3: the header and FlatBuffer hash to %016llx, the header records %016llx (the "
                       "file is corrupt)",
                       static_cast<unsigned long long>(sum), static_cast<unsigned long long>(h.checksum_xxh3));
  }
  if (out) *out = h;
  return body;
}

static std::string hex(uint64_t v) { return strformat("%016llx", static_cast<unsigned long long>(v)); }

Status check_weights_record(const detail::ProgramImpl& p, const SafetensorsFile& file, bool full) {
  const FileHeader& h = p.header;
  if (!(h.flags & kHeaderHasWeights)) {
    SB_CHECK_OR_RETURN(!full, StatusCode::kFailedPrecondition,
                       "%s: records no weights checksum (format %u, or not written by export), so %s cannot be "
                       "verified against it",
                       p.origin.c_str(), h.format_version, file.path().c_str());
    return Status::ok();
  }
  const WeightsFingerprint want{h.weights_bytes, h.weights_header_xxh3}, got = file.fingerprint();
  SB_CHECK_OR_RETURN(got == want, StatusCode::kInvalidWeights,
                     "%s was exported with a weights file of %llu bytes (header xxh3 %s), but %s is %llu bytes "
                     "(header xxh3 %s): the program and the weights come from different exports",
                     p.origin.c_str(), static_cast<unsigned long long>(want.file_bytes), hex(want.header_xxh3).c_str(),
                     file.path().c_str(), static_cast<unsigned long long>(got.file_bytes),
                     hex(got.header_xxh3).c_str());
  if (full) {
    const uint64_t sum = file.content_xxh3();
    SB_CHECK_OR_RETURN(sum == h.weights_xxh3, StatusCode::kInvalidWeights,
                       "%s: its contents hash to %s, but %s recorded %s at export: the weights file is corrupt",
                       file.path().c_str(), hex(sum).c_str(), p.origin.c_str(), hex(h.weights_xxh3).c_str());
  }
  return Status::ok();
}

Result<std::unique_ptr<fb::ProgramT>> parse_program(std::span<const uint8_t> bytes, FileHeader* header) {
  SB_ASSIGN_OR_RETURN(std::span<const uint8_t> body, check_header(bytes, header));
  SB_CHECK_OR_RETURN(body.size() < FLATBUFFERS_MAX_BUFFER_SIZE, StatusCode::kInvalidProgram,
                     "flatbuffer: %zu bytes exceeds the 2 GiB FlatBuffer limit", body.size());
  // FlatBuffers needs its buffer aligned; the file bytes may sit anywhere.
  std::vector<uint64_t> aligned((body.size() + 7) / 8);
  if (!body.empty()) std::memcpy(aligned.data(), body.data(), body.size());
  const auto* data = reinterpret_cast<const uint8_t*>(aligned.data());
  flatbuffers::Verifier::Options opts;
  opts.max_depth = 64;
  opts.max_tables = 1u << 22;
  flatbuffers::Verifier verifier(data, body.size(), opts);
  SB_CHECK_OR_RETURN(body.size() >= 8 && fb::ProgramBufferHasIdentifier(data), StatusCode::kInvalidProgram,
                     "flatbuffer: missing file identifier \"SWB1\"");
  SB_CHECK_OR_RETURN(fb::VerifyProgramBuffer(verifier), StatusCode::kInvalidProgram,
                     "flatbuffer: verification failed (truncated or corrupt, %zu bytes)", body.size());
  auto ir = std::unique_ptr<fb::ProgramT>(fb::GetProgram(data)->UnPack());
  SB_RETURN_IF_ERROR(validate_program(*ir));
  log::debug("program: verified and validated ({} chains, {} tensor slots, {} value slots)", ir->chains.size(),
             ir->num_tensor_slots, ir->num_value_slots);
  return ir;
}

std::string dims_str(const std::vector<std::unique_ptr<fb::DimT>>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    const auto& d = *dims[i];
    if (d.size >= 0) {
      s += std::to_string(d.size);
    } else {
      s += "?" + std::to_string(d.min) + ".." + (d.max < 0 ? std::string("inf") : std::to_string(d.max));
    }
  }
  return s + "]";
}

bool shape_fits(const Shape& s, const std::vector<std::unique_ptr<fb::DimT>>& dims) {
  if (s.size() != dims.size()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto& d = *dims[i];
    if (d.size >= 0 ? s[i] != d.size : (s[i] < d.min || (d.max >= 0 && s[i] > d.max))) return false;
  }
  return true;
}

}  // namespace switchboard
