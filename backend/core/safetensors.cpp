#include "safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "file_io.h"
#include "hash.h"
#include "mapped_file.h"

namespace switchboard {
namespace {

using Json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // real headers are kilobytes; refuse absurd allocations
constexpr size_t kMaxRank = 16;
constexpr const char* kMetadataKey = "__metadata__";

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypeNames[] = {
    {DType::kF32, "F32"}, {DType::kF16, "F16"}, {DType::kBF16, "BF16"}, {DType::kI32, "I32"},
    {DType::kI64, "I64"}, {DType::kU8, "U8"},   {DType::kU32, "U32"},   {DType::kBool, "BOOL"},
};

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (const auto& d : kDTypeNames) {
    if (name == d.name) return d.dtype;
  }
  return std::nullopt;
}

Status invalid(const std::string& msg) { return Status(StatusCode::kInvalidWeights, msg); }

// A JSON value for an error message, shortened so a hostile header cannot make huge messages.
std::string brief(const Json& v) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > 64) s = s.substr(0, 61) + "...";
  return s;
}

std::string offsets_str(uint64_t begin, uint64_t end) {
  return strformat("[%llu, %llu]", static_cast<unsigned long long>(begin),
                   static_cast<unsigned long long>(end));
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Deepest bracket nesting outside strings; lets us refuse deep nesting before nlohmann allocates for it.
int json_depth(std::string_view text) {
  int depth = 0, max_depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;  // skip the escaped character
      if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

Status parse_dtype(const Json& obj, DType* out) {
  auto it = obj.find("dtype");
  if (it == obj.end()) return invalid("missing 'dtype'");
  if (!it->is_string()) return invalid("dtype " + brief(*it) + " is not a string");
  const std::string& name = it->get_ref<const std::string&>();
  std::optional<DType> dtype = dtype_from_safetensors(name);
  if (!dtype) {
    return invalid("dtype '" + name + "' is not supported (F32, F16, BF16, I32, I64, U8, U32, BOOL)");
  }
  *out = *dtype;
  return Status::ok();
}

Status parse_shape(const Json& obj, Shape* out) {
  auto it = obj.find("shape");
  if (it == obj.end()) return invalid("missing 'shape'");
  if (!it->is_array()) return invalid("shape " + brief(*it) + " is not an array");
  if (it->size() > kMaxRank) {
    return invalid(strformat("shape has rank %zu, more than %zu", it->size(), kMaxRank));
  }
  out->clear();
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& d = (*it)[i];
    constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    if (!d.is_number_unsigned() || d.get<uint64_t>() > kMax) {
      return invalid(strformat("shape[%zu] = ", i) + brief(d) + " is not a non-negative integer");
    }
    out->push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }
  return Status::ok();
}

Status parse_offsets(const Json& obj, uint64_t data_size, uint64_t* begin, uint64_t* end) {
  auto it = obj.find("data_offsets");
  if (it == obj.end()) return invalid("missing 'data_offsets'");
  const Json& v = *it;
  if (!v.is_array() || v.size() != 2 || !v[0].is_number_unsigned() || !v[1].is_number_unsigned()) {
    return invalid("data_offsets " + brief(v) + " is not an array of 2 unsigned integers");
  }
  *begin = v[0].get<uint64_t>();
  *end = v[1].get<uint64_t>();
  const std::string offs = "data_offsets " + offsets_str(*begin, *end);
  if (*begin > *end) return invalid(offs + " begin after end");
  if (*end > data_size) {
    return invalid(offs + strformat(" end past the data section (%llu bytes)",
                                    static_cast<unsigned long long>(data_size)));
  }
  return Status::ok();
}

// Fills `e` from one header entry; the message names the field, the caller adds file and key.
Status parse_entry(const Json& v, uint64_t data_size, SafetensorsEntry* e) {
  if (!v.is_object()) return invalid("entry " + brief(v) + " is not an object");
  SB_RETURN_IF_ERROR(parse_dtype(v, &e->dtype));
  SB_RETURN_IF_ERROR(parse_shape(v, &e->shape));
  SB_RETURN_IF_ERROR(parse_offsets(v, data_size, &e->begin, &e->end));
  Result<int64_t> numel = shape_numel(e->shape);
  if (!numel.is_ok()) return invalid("shape " + shape_str(e->shape) + " element count overflows");
  // Compare by division so numel * dtype size can never overflow.
  const uint64_t bytes = e->end - e->begin, esize = dtype_size(e->dtype);
  if (bytes % esize != 0 || bytes / esize != static_cast<uint64_t>(*numel)) {
    return invalid(
        strformat("data_offsets %s hold %llu bytes but shape %s of %s needs %lld elements of %zu bytes",
                  offsets_str(e->begin, e->end).c_str(), static_cast<unsigned long long>(bytes),
                  shape_str(e->shape).c_str(), safetensors_dtype_name(e->dtype),
                  static_cast<long long>(*numel), static_cast<size_t>(esize)));
  }
  return Status::ok();
}

Status parse_metadata(const Json& v, std::map<std::string, std::string>* out) {
  if (!v.is_object()) return invalid(std::string(kMetadataKey) + " " + brief(v) + " is not an object");
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it->is_string()) {
      return invalid(std::string(kMetadataKey) + " '" + it.key() + "': value " + brief(*it) +
                     " is not a string");
    }
    (*out)[it.key()] = it->get_ref<const std::string&>();
  }
  return Status::ok();
}

// Rejects any two entries whose byte ranges intersect, naming both.
Status check_overlaps(const std::map<std::string, SafetensorsEntry>& entries) {
  std::vector<std::pair<const std::string*, const SafetensorsEntry*>> sorted;
  for (const auto& [name, e] : entries) sorted.emplace_back(&name, &e);
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.second->begin != b.second->begin ? a.second->begin < b.second->begin
                                              : a.second->end < b.second->end;
  });
  // Track the entry reaching furthest so far: a long tensor can overlap several later ones.
  const std::pair<const std::string*, const SafetensorsEntry*>* reach = nullptr;
  for (const auto& cur : sorted) {
    if (reach && cur.second->begin < reach->second->end) {
      return invalid("tensors '" + *reach->first + "' data_offsets " +
                     offsets_str(reach->second->begin, reach->second->end) + " and '" + *cur.first +
                     "' data_offsets " + offsets_str(cur.second->begin, cur.second->end) + " overlap");
    }
    if (!reach || cur.second->end > reach->second->end) reach = &cur;
  }
  return Status::ok();
}

std::string errno_str() { return std::strerror(errno); }

}  // namespace

const char* safetensors_dtype_name(DType t) {
  for (const auto& d : kDTypeNames) {
    if (d.dtype == t) return d.name;
  }
  return "?";
}

Result<std::shared_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path, WeightsAccess access) {
  if (access == WeightsAccess::kRead) {
    SB_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, read_regular_file(path, UINT64_MAX, "weights file"));
    return from_bytes(std::move(bytes), path);
  }
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // a FIFO cannot block us: fstat below
  if (fd < 0) return Status(StatusCode::kIoError, path + ": cannot open: " + errno_str());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    Status s(StatusCode::kIoError, path + ": cannot stat: " + errno_str());
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status(StatusCode::kIoError, path + ": not a regular file");
  }
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ < 8) {
    ::close(fd);
    return invalid(strformat("%s: file is %zu bytes, too short for the 8-byte header length", path.c_str(),
                             file->size_));
  }
  auto map = MappedFile::map(fd, file->size_, path);
  ::close(fd);
  if (!map) return map.status();
  file->map_ = std::move(map).value();
  file->base_ = file->map_->data();
  return finish(std::move(file));
}

Result<std::shared_ptr<SafetensorsFile>> SafetensorsFile::from_bytes(std::vector<uint8_t> bytes,
                                                                     std::string origin) {
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = std::move(origin);
  file->bytes_ = std::move(bytes);
  file->base_ = file->bytes_.data();
  file->size_ = file->bytes_.size();
  if (file->size_ < 8) {
    return invalid(strformat("%s: file is %zu bytes, too short for the 8-byte header length",
                             file->path_.c_str(), file->size_));
  }
  return finish(std::move(file));
}

Result<std::shared_ptr<SafetensorsFile>> SafetensorsFile::finish(std::shared_ptr<SafetensorsFile> file) {
  file->self_ = file;
  SB_RETURN_IF_ERROR(file->parse());
  return file;
}

SafetensorsFile::~SafetensorsFile() = default;

WeightsFingerprint SafetensorsFile::fingerprint() const { return {size_, xxh3_64(base_, data_start_)}; }

uint64_t SafetensorsFile::content_xxh3() const { return xxh3_64(base_, size_); }

bool SafetensorsFile::changed_on_disk() const { return map_ != nullptr && map_->faulted(); }

Status SafetensorsFile::parse() {
  const uint64_t n = read_u64_le(base_);
  const uint64_t room = size_ - 8;  // size_ >= 8 was checked by the caller
  if (n > room) {
    return invalid(strformat("%s: header length %llu past the end of the file (%zu bytes)", path_.c_str(),
                             static_cast<unsigned long long>(n), size_));
  }
  if (n > kMaxHeaderBytes) {
    return invalid(strformat("%s: header length %llu over the %llu-byte limit", path_.c_str(),
                             static_cast<unsigned long long>(n),
                             static_cast<unsigned long long>(kMaxHeaderBytes)));
  }
  data_start_ = 8 + static_cast<size_t>(n);
  const char* text = reinterpret_cast<const char*>(base_ + 8);
  if (json_depth(std::string_view(text, static_cast<size_t>(n))) > kMaxJsonDepth) {
    return invalid(strformat("%s: header JSON nests deeper than %d levels", path_.c_str(), kMaxJsonDepth));
  }
  const Json header = Json::parse(text, text + n, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) {
    return invalid(strformat("%s: header (%llu bytes) is not valid JSON", path_.c_str(),
                             static_cast<unsigned long long>(n)));
  }
  if (!header.is_object()) return invalid(path_ + ": header " + brief(header) + " is not a JSON object");
  const uint64_t data_size = size_ - data_start_;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == kMetadataKey) {
      Status s = parse_metadata(*it, &metadata_);
      if (!s.is_ok()) return invalid(path_ + ": " + s.message());
      continue;
    }
    SafetensorsEntry e{};
    Status s = parse_entry(*it, data_size, &e);
    if (!s.is_ok()) return invalid(path_ + ": tensor '" + it.key() + "': " + s.message());
    entries_[it.key()] = std::move(e);
  }
  Status s = check_overlaps(entries_);
  if (!s.is_ok()) return invalid(path_ + ": " + s.message());
  return Status::ok();
}

Result<Tensor> SafetensorsFile::tensor(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return Status(StatusCode::kNotFound, path_ + ": no tensor '" + name + "'");
  const SafetensorsEntry& e = it->second;
  const uint8_t* p = base_ + data_start_ + e.begin;
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(e.dtype) == 0) {
    // The alias keeps *this (and so the mapping) alive while the tensor lives.
    if (std::shared_ptr<const SafetensorsFile> self = self_.lock()) {
      return Tensor::wrap(e.dtype, e.shape, std::shared_ptr<const void>(self, p), p);
    }
  }
  SB_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(e.dtype, e.shape));
  if (e.end > e.begin) std::memcpy(t.mutable_data(), p, static_cast<size_t>(e.end - e.begin));
  return t;
}

}  // namespace switchboard
