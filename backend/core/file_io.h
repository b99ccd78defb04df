// Reading untrusted files: only regular files (a FIFO, device or directory is refused
// without blocking: opened non-blocking, then fstat), only up to a stated size, and an
// allocation failure is an error value. Every error names the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "switchboard/status.h"

namespace switchboard {

// The whole of `path` (`what` names it in errors, e.g. "program"), at most `max_bytes`.
Result<std::vector<uint8_t>> read_regular_file(const std::string& path, uint64_t max_bytes, const char* what);
// The same as text.
Result<std::string> read_text_file(const std::string& path, uint64_t max_bytes, const char* what);

// XXH3-64 of the whole of `path`, read in 4 MiB pieces (no mapping: the pages stay out of
// this process's resident memory).
Result<uint64_t> xxh3_file(const std::string& path);

// JSON nested deeper than `max_depth` is refused before it is parsed (a deep value would
// overflow the stack where the parser's values are dumped into an error message).
Status check_json_depth(const std::string& text, int max_depth, const std::string& origin);
inline constexpr int kMaxJsonDepth = 64;

// The host memory available now (MemAvailable of /proc/meminfo) in bytes; 0 when unknown.
uint64_t host_memory_available();

// `text` cut to ~`max` characters for an error message ("..." and the full length after),
// control characters escaped (\n, \xNN) so the message stays on one line.
std::string clip(const std::string& text, size_t max = 80);

}  // namespace switchboard
