// SafetensorsWriter: the header laid out first, then tensors written in place as they come.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>

#include <nlohmann/json.hpp>

#include "safetensors.h"

namespace switchboard {
namespace {

using Json = nlohmann::json;
constexpr size_t kDataAlign = 64;
constexpr const char* kMetadataKey = "__metadata__";

// Strict UTF-8 check (no overlongs, surrogates or code points past U+10FFFF), as the JSON writer requires.
bool is_valid_utf8(std::string_view s) {
  static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<uint8_t>(s[i]);
    const size_t n = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xe ? 2 : (c >> 3) == 0x1e ? 3 : 4;
    if (n == 4 || n >= s.size() - i) return false;  // invalid lead byte or truncated sequence
    uint32_t cp = c & (0x7fu >> n);
    for (size_t k = 1; k <= n; ++k) {
      const auto cc = static_cast<uint8_t>(s[i + k]);
      if ((cc >> 6) != 0x2) return false;
      cp = (cp << 6) | (cc & 0x3fu);
    }
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n + 1;
  }
  return true;
}

Status check_names(const std::vector<TensorSpec>& specs, const std::map<std::string, std::string>& metadata) {
  std::map<std::string, int> seen;
  for (const TensorSpec& s : specs) {
    SB_CHECK_OR_RETURN(is_valid_utf8(s.name), StatusCode::kInvalidArgument, "tensor name is not valid UTF-8");
    SB_CHECK_OR_RETURN(s.name != kMetadataKey, StatusCode::kInvalidArgument, "tensor name '%s' is reserved",
                       kMetadataKey);
    SB_CHECK_OR_RETURN(seen[s.name]++ == 0, StatusCode::kInvalidArgument, "tensor '%s' given twice", s.name.c_str());
    SB_RETURN_IF_ERROR(shape_numel(s.shape).status());
  }
  for (const auto& [k, v] : metadata)
    SB_CHECK_OR_RETURN(is_valid_utf8(k) && is_valid_utf8(v), StatusCode::kInvalidArgument,
                       "metadata entry is not valid UTF-8");
  return Status::ok();
}

bool write_at(int fd, const void* data, size_t n, uint64_t offset) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return true;
}

std::string errno_str() { return std::strerror(errno); }

}  // namespace

Result<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::create(const std::string& path,
                                                                     const std::vector<TensorSpec>& specs,
                                                                     const std::map<std::string, std::string>& metadata) {
  Status names = check_names(specs, metadata);
  if (!names.is_ok()) return Status(names.code(), path + ": " + names.message());
  std::vector<size_t> order(specs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // Largest elements first: every tensor size is a multiple of its element size, so each start stays aligned.
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return dtype_size(specs[a].dtype) > dtype_size(specs[b].dtype); });
  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter());
  Json header = Json::object();
  uint64_t offset = 0;
  for (size_t i : order) {
    const TensorSpec& s = specs[i];
    const uint64_t bytes = static_cast<uint64_t>(*shape_numel(s.shape)) * dtype_size(s.dtype);
    header[s.name] = {{"dtype", safetensors_dtype_name(s.dtype)},
                      {"shape", s.shape},
                      {"data_offsets", Json::array({offset, offset + bytes})}};
    w->places_[s.name] = Place{s.dtype, s.shape, offset, bytes, false};
    offset += bytes;
  }
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::string text = header.dump(-1, ' ', false, Json::error_handler_t::replace);
  text.append((kDataAlign - (8 + text.size()) % kDataAlign) % kDataAlign, ' ');
  const uint64_t data_start = 8 + text.size();
  for (auto& [name, place] : w->places_) place.offset += data_start;
  w->path_ = path;
  w->tmp_ = path + ".tmp";
  w->fd_ = ::open(w->tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd_ < 0) return Status(StatusCode::kIoError, path + ": cannot create " + w->tmp_ + ": " + errno_str());
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  if (!write_at(w->fd_, len, 8, 0) || !write_at(w->fd_, text.data(), text.size(), 8) ||
      ::ftruncate(w->fd_, static_cast<off_t>(data_start + offset)) != 0)
    return Status(StatusCode::kIoError, path + ": cannot write " + w->tmp_ + ": " + errno_str());
  return w;
}

Status SafetensorsWriter::write(const std::string& name, const Tensor& t) {
  auto it = places_.find(name);
  SB_CHECK_OR_RETURN(it != places_.end(), StatusCode::kInvalidArgument, "%s: tensor '%s' was not declared",
                     path_.c_str(), name.c_str());
  Place& p = it->second;
  SB_CHECK_OR_RETURN(!p.written, StatusCode::kInvalidArgument, "%s: tensor '%s' given twice", path_.c_str(),
                     name.c_str());
  SB_CHECK_OR_RETURN(t.dtype() == p.dtype && t.shape() == p.shape, StatusCode::kInvalidArgument,
                     "%s: tensor '%s' is %s %s, declared %s %s", path_.c_str(), name.c_str(), dtype_name(t.dtype()),
                     shape_str(t.shape()).c_str(), dtype_name(p.dtype), shape_str(p.shape).c_str());
  SB_CHECK_OR_RETURN(t.data() != nullptr || p.bytes == 0, StatusCode::kInvalidArgument, "%s: tensor '%s' has no data",
                     path_.c_str(), name.c_str());
  if (!write_at(fd_, t.data(), static_cast<size_t>(p.bytes), p.offset))
    return Status(StatusCode::kIoError, path_ + ": cannot write " + tmp_ + ": " + errno_str());
  p.written = true;
  return Status::ok();
}

Status SafetensorsWriter::finish() {
  for (const auto& [name, p] : places_)
    SB_CHECK_OR_RETURN(p.written, StatusCode::kInvalidArgument, "%s: tensor '%s' was declared but never written",
                       path_.c_str(), name.c_str());
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return Status(StatusCode::kIoError, path_ + ": cannot write " + tmp_ + ": " + errno_str());
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
    return Status(StatusCode::kIoError, path_ + ": cannot rename " + tmp_ + ": " + errno_str());
  finished_ = true;
  return Status::ok();
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_ && !tmp_.empty()) std::remove(tmp_.c_str());
}

Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  for (const auto& [name, t] : tensors) specs.push_back({name, t.dtype(), t.shape()});
  SB_ASSIGN_OR_RETURN(auto w, SafetensorsWriter::create(path, specs, metadata));
  for (const auto& [name, t] : tensors) SB_RETURN_IF_ERROR(w->write(name, t));
  return w->finish();
}

}  // namespace switchboard
