// libFuzzer target: program bytes -> loader + validator, then (for programs
// without constants) one execution on small zero inputs. Every outcome must be
// a Status; sanitizers turn anything else into a crash.
#include <cstddef>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "hash.h"
#include "program_impl.h"
#include "switchboard/switchboard.h"

namespace {

using namespace switchboard;

constexpr int64_t kMaxInputElems = 4096;

// Each dynamic dim at its lower bound; false when the input would exceed kMaxInputElems.
bool small_shape(const IoInfo& in, Shape* shape) {
  int64_t n = 1;
  for (const DimInfo& d : in.shape) {
    int64_t v = d.size >= 0 ? d.size : d.min;
    if (v < 0 || (v > 0 && n > kMaxInputElems / v)) return false;
    n *= v;
    shape->push_back(v);
  }
  return true;
}

void run_once(const std::shared_ptr<const Program>& program) {
  SessionOptions opts;
  opts.max_buffer_bytes = 64u << 20;  // libFuzzer's RSS limit is 2 GiB; real programs get the default
  auto session = Session::create(program, opts);
  if (!session.is_ok()) return;
  for (const IoInfo& in : program->inputs()) {
    if (!in.is_tensor) {
      (void)(*session)->set_input_value(in.name, 1);  // a plausible size or index
      continue;
    }
    Shape shape;
    if (!small_shape(in, &shape)) return;
    auto t = Tensor::zeros(in.dtype, shape);
    if (!t.is_ok()) return;
    (void)(*session)->set_input(in.name, *t);
  }
  (void)(*session)->execute();
}

}  // namespace

// Keeps freed tensors from piling up in the buffer pool under libFuzzer's RSS limit.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("SWITCHBOARD_BUFFER_POOL_MB", "64", 0);
  return 0;
}

// A mutated format 2 file almost always fails its checksum: record the checksum again
// (as a corrupter who knew the format would), so mutations reach the verifier and validator.
static void restamp(std::vector<uint8_t>& bytes) {
  FileHeader h{};
  if (bytes.size() < sizeof h) return;
  std::memcpy(&h, bytes.data(), sizeof h);
  if (h.format_version != 2 || h.flatbuffer_offset > bytes.size() || h.flatbuffer_size > bytes.size() - h.flatbuffer_offset)
    return;
  h.checksum_xxh3 = program_checksum(h, std::span<const uint8_t>(bytes).subspan(h.flatbuffer_offset, h.flatbuffer_size));
  std::memcpy(bytes.data(), &h, sizeof h);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  (void)Program::from_bytes(bytes, "fuzz", LoadOptions{{}, false});  // as given: the checksum's own path
  restamp(bytes);
  auto program = Program::from_bytes(bytes, "fuzz", LoadOptions{{}, false});
  if (!program.is_ok() || !(*program)->impl().ir->constants.empty()) return 0;
  // A session needs resolved constants; with none, resolving against no weights files succeeds.
  auto runnable = Program::from_bytes(std::move(bytes), "fuzz", LoadOptions{});
  if (runnable.is_ok()) run_once(*runnable);
  return 0;
}
