#include "file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>

#include "hash.h"

namespace switchboard {
namespace {

// Closes the descriptor on every path out.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

Status read_all(int fd, uint8_t* dst, size_t size, const std::string& path) {
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::read(fd, dst + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    SB_CHECK_OR_RETURN(n >= 0, StatusCode::kIoError, "%s: read error: %s", path.c_str(), std::strerror(errno));
    SB_CHECK_OR_RETURN(n > 0, StatusCode::kIoError, "%s: file shrank while being read (%zu of %zu bytes)",
                       path.c_str(), done, size);
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

}  // namespace

Result<std::vector<uint8_t>> read_regular_file(const std::string& path, uint64_t max_bytes, const char* what) {
  SB_CHECK_OR_RETURN(!path.empty(), StatusCode::kInvalidArgument, "%s: no file named (empty path)", what);
  Fd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};  // non-blocking: a FIFO cannot hang us
  SB_CHECK_OR_RETURN(f.fd >= 0, errno == ENOENT ? StatusCode::kNotFound : StatusCode::kIoError,
                     "%s %s: cannot open: %s", what, path.c_str(), std::strerror(errno));
  struct stat st {};
  SB_CHECK_OR_RETURN(::fstat(f.fd, &st) == 0, StatusCode::kIoError, "%s %s: cannot stat: %s", what, path.c_str(),
                     std::strerror(errno));
  SB_CHECK_OR_RETURN(S_ISREG(st.st_mode), StatusCode::kInvalidArgument, "%s %s: not a regular file", what,
                     path.c_str());
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  SB_CHECK_OR_RETURN(size <= max_bytes, StatusCode::kInvalidArgument,
                     "%s %s: %llu bytes, more than the %llu this reader takes", what, path.c_str(),
                     (unsigned long long)size, (unsigned long long)max_bytes);
  std::vector<uint8_t> bytes;
  try {
    bytes.resize(static_cast<size_t>(size));
  } catch (const std::bad_alloc&) {
    return make_error(StatusCode::kResourceExhausted, "%s %s: cannot allocate %llu bytes", what, path.c_str(),
                      (unsigned long long)size);
  }
  SB_RETURN_IF_ERROR(read_all(f.fd, bytes.data(), bytes.size(), path));
  return bytes;
}

Result<uint64_t> xxh3_file(const std::string& path) {
  Fd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  SB_CHECK_OR_RETURN(f.fd >= 0, StatusCode::kIoError, "%s: cannot open: %s", path.c_str(), std::strerror(errno));
  struct stat st {};
  SB_CHECK_OR_RETURN(::fstat(f.fd, &st) == 0 && S_ISREG(st.st_mode), StatusCode::kIoError,
                     "%s: not a regular file", path.c_str());
  Xxh3Stream h;
  std::vector<uint8_t> buf(size_t{4} << 20);
  for (;;) {
    const ssize_t n = ::read(f.fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    SB_CHECK_OR_RETURN(n >= 0, StatusCode::kIoError, "%s: read error: %s", path.c_str(), std::strerror(errno));
    if (n == 0) return h.digest();
    h.update(buf.data(), static_cast<size_t>(n));
  }
}

Result<std::string> read_text_file(const std::string& path, uint64_t max_bytes, const char* what) {
  SB_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, read_regular_file(path, max_bytes, what));
  return std::string(bytes.begin(), bytes.end());
}

Status check_json_depth(const std::string& text, int max_depth, const std::string& origin) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {  // brackets inside strings do not nest
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '[' || c == '{')
      SB_CHECK_OR_RETURN(++depth <= max_depth, StatusCode::kInvalidArgument,
                         "%s: JSON nested deeper than %d levels (at byte %zu)", origin.c_str(), max_depth, i);
    if (c == ']' || c == '}') --depth;
  }
  return Status::ok();
}

uint64_t host_memory_available() {
  // A procfs file reports size 0, so it is read by lines, not through read_regular_file.
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  while (in >> key >> kb) {
    if (key == "MemAvailable:") return kb << 10;
    in.ignore(1 << 10, '\n');
  }
  return 0;
}

std::string clip(const std::string& text, size_t max) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < max; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n') out += "\\n";
    else if (c < 0x20 || c == 0x7f) out += strformat("\\x%02x", c);  // one message stays one line
    else out += static_cast<char>(c);
  }
  if (text.size() > max) out += strformat("... (%zu characters)", text.size());
  return out;
}

}  // namespace switchboard
