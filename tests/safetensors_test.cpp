#include "safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

namespace switchboard {
namespace {

constexpr const char* kOrigin = "mem.safetensors";

// A fresh directory per test, so parallel test runs never collide.
std::string make_temp_dir() {
  std::string tmpl = testing::TempDir() + "/sb_safetensors_XXXXXX";
  const char* dir = mkdtemp(tmpl.data());
  EXPECT_NE(dir, nullptr);
  return tmpl;
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> u64_le(uint64_t v) {
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
  return out;
}

// A raw file: header length, `header` verbatim, then `data_bytes` bytes counting up from 0.
std::vector<uint8_t> make_raw(std::string_view header, size_t data_bytes) {
  // Reserved up front: growing u64_le's 8 bytes in place draws GCC 12's false -Warray-bounds.
  std::vector<uint8_t> out;
  out.reserve(8 + header.size() + data_bytes);
  for (uint8_t b : u64_le(header.size())) out.push_back(b);
  out.insert(out.end(), header.begin(), header.end());
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<uint8_t>(i));
  return out;
}

Result<std::shared_ptr<SafetensorsFile>> parse(std::vector<uint8_t> bytes) {
  return SafetensorsFile::from_bytes(std::move(bytes), kOrigin);
}

// Asserts an InvalidWeights error whose message names the file and contains every fragment.
void expect_invalid(const std::vector<uint8_t>& bytes, std::initializer_list<std::string_view> fragments) {
  auto file = parse(bytes);
  ASSERT_FALSE(file.is_ok());
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidWeights);
  const std::string& msg = file.status().message();
  EXPECT_EQ(msg.rfind(std::string(kOrigin) + ": ", 0), 0u) << msg;
  for (std::string_view f : fragments)
    EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
}

void expect_invalid(std::string_view header, size_t data_bytes,
                    std::initializer_list<std::string_view> fragments) {
  expect_invalid(make_raw(header, data_bytes), fragments);
}

// Distinct bytes for a tensor of `dtype` and `shape` (any bit pattern is fine for a byte round trip).
Tensor patterned(DType dtype, Shape shape, uint8_t seed) {
  Tensor t = *Tensor::zeros(dtype, std::move(shape));
  auto* p = static_cast<uint8_t*>(t.mutable_data());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(seed + i * 7);
  if (dtype == DType::kBool) {
    for (size_t i = 0; i < t.nbytes(); ++i) p[i] &= 1;
  }
  return t;
}

std::vector<std::pair<std::string, Tensor>> all_dtype_tensors() {
  return {
      {"u8", patterned(DType::kU8, {3}, 1)},         {"f32", patterned(DType::kF32, {2, 3}, 2)},
      {"bool", patterned(DType::kBool, {5}, 3)},     {"f16", patterned(DType::kF16, {3, 1}, 4)},
      {"i64", patterned(DType::kI64, {2}, 5)},       {"bf16", patterned(DType::kBF16, {7}, 6)},
      {"i32", patterned(DType::kI32, {1, 2, 2}, 7)}, {"u32", patterned(DType::kU32, {3}, 8)},
      {"scalar", patterned(DType::kF32, {}, 9)},     {"empty", patterned(DType::kF16, {0, 4}, 10)},
  };
}

// A small valid file written by write_safetensors, for the truncation and bit-flip tests.
std::vector<uint8_t> small_valid_file() {
  const std::string path = make_temp_dir() + "/small.safetensors";
  Status s = write_safetensors(
      path, {{"a", patterned(DType::kF32, {2}, 1)}, {"b", patterned(DType::kU8, {3}, 2)}}, {{"k", "v"}});
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return read_file_bytes(path);
}

// Reads every byte of every tensor, so ASan sees any out-of-bounds view.
void touch_all(const SafetensorsFile& file) {
  for (const auto& [name, e] : file.entries()) {
    auto t = file.tensor(name);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    const auto* p = static_cast<const uint8_t*>(t->data());
    unsigned sum = 0;
    for (size_t i = 0; i < t->nbytes(); ++i) sum += p[i];
    (void)sum;
  }
}

TEST(SafetensorsRoundTrip, AllDtypesReadBackByteExact) {
  const std::string path = make_temp_dir() + "/w.safetensors";
  const auto tensors = all_dtype_tensors();
  ASSERT_TRUE(write_safetensors(path, tensors).is_ok());
  EXPECT_FALSE(file_exists(path + ".tmp"));
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  EXPECT_EQ((*file)->path(), path);
  ASSERT_EQ((*file)->entries().size(), tensors.size());
  for (const auto& [name, want] : tensors) {
    auto got = (*file)->tensor(name);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    EXPECT_EQ(got->dtype(), want.dtype()) << name;
    EXPECT_EQ(got->shape(), want.shape()) << name;
    ASSERT_EQ(got->nbytes(), want.nbytes()) << name;
    EXPECT_EQ(std::memcmp(got->data(), want.data(), want.nbytes()), 0) << name;
  }
}

TEST(SafetensorsRoundTrip, LayoutIsAlignedContiguousAndSortedByDtypeSize) {
  const std::string path = make_temp_dir() + "/w.safetensors";
  ASSERT_TRUE(write_safetensors(path, all_dtype_tensors()).is_ok());
  const std::vector<uint8_t> bytes = read_file_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  EXPECT_EQ((8 + n) % 64, 0u);
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, e] : (*file)->entries()) entries.push_back(e);
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t offset = 0;
  size_t last_size = 8;
  for (const auto& e : entries) {
    EXPECT_EQ(e.begin, offset);
    EXPECT_EQ(e.begin % dtype_size(e.dtype), 0u);
    if (e.end > e.begin) {
      EXPECT_LE(dtype_size(e.dtype), last_size);
      last_size = dtype_size(e.dtype);
    }
    offset = e.end;
  }
  EXPECT_EQ(8 + n + offset, bytes.size());
}

TEST(SafetensorsRoundTrip, AlignedTensorsAreZeroCopyAndKeepTheMappingAlive) {
  const std::string path = make_temp_dir() + "/w.safetensors";
  const auto tensors = all_dtype_tensors();
  ASSERT_TRUE(write_safetensors(path, tensors).is_ok());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.is_ok());
  // Every view must sit at one data-section base plus its begin offset, i.e. inside the mapping.
  const uint8_t* data_base =
      static_cast<const uint8_t*>((*file)->tensor("f32")->data()) - (*file)->entries().at("f32").begin;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(data_base) % 64, 0u);
  std::vector<std::pair<std::string, Tensor>> views;
  for (const auto& [name, e] : (*file)->entries()) {
    Tensor t = *(*file)->tensor(name);
    EXPECT_EQ(static_cast<const uint8_t*>(t.data()), data_base + e.begin) << name;
    EXPECT_EQ((*file)->tensor(name)->data(), t.data()) << name;
    views.emplace_back(name, t);
  }
  file = Status(StatusCode::kInternal, "dropped");  // our last reference: the views must keep the map alive
  for (const auto& [name, want] : tensors) {
    auto it = std::find_if(views.begin(), views.end(), [&](const auto& v) { return v.first == name; });
    ASSERT_NE(it, views.end());
    EXPECT_EQ(std::memcmp(it->second.data(), want.data(), want.nbytes()), 0) << name;
  }
}

TEST(SafetensorsRoundTrip, MisalignedTensorIsCopiedToAlignedStorage) {
  // A one-byte hole puts the U32 tensor at an odd address: tensor() must copy it.
  std::string header = R"({"x":{"dtype":"U32","shape":[2],"data_offsets":[1,9]}})";
  header.append(64 - 8 - header.size(), ' ');
  auto file = parse(make_raw(header, 9));
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  Tensor a = *(*file)->tensor("x");
  Tensor b = *(*file)->tensor("x");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 4, 0u);
  EXPECT_NE(a.data(), b.data());
  const uint8_t want[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(std::memcmp(a.data(), want, 8), 0);
}

TEST(SafetensorsRoundTrip, MetadataRoundTrips) {
  const std::string path = make_temp_dir() + "/m.safetensors";
  const std::map<std::string, std::string> meta = {{"format", "pt"},
                                                   {"note", "h\xc3\xa9llo \"quoted\""},
                                                   {"", ""},
                                                   {"brackets", "\\\"" + std::string(200, '[') + "\"{"}};
  ASSERT_TRUE(write_safetensors(path, {{"w", patterned(DType::kF32, {1}, 0)}}, meta).is_ok());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  EXPECT_EQ((*file)->metadata(), meta);
  EXPECT_EQ((*file)->entries().count("__metadata__"), 0u);
}

TEST(SafetensorsRoundTrip, EmptyTensorListIsValid) {
  const std::string path = make_temp_dir() + "/e.safetensors";
  ASSERT_TRUE(write_safetensors(path, {}).is_ok());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  EXPECT_TRUE((*file)->entries().empty());
}

TEST(SafetensorsRead, HolesBetweenTensorsAreAccepted) {
  auto file = parse(make_raw(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
                                 "b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}})",
                             16));
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  EXPECT_EQ(static_cast<const uint8_t*>((*file)->tensor("b")->data())[0], 8);
}

TEST(SafetensorsRead, MissingTensorIsNotFound) {
  auto file = parse(make_raw("{}", 0));
  ASSERT_TRUE(file.is_ok());
  auto t = (*file)->tensor("model.w");
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find(kOrigin), std::string::npos);
  EXPECT_NE(t.status().message().find("'model.w'"), std::string::npos);
}

TEST(SafetensorsRead, OpenMissingFileIsIoError) {
  const std::string path = make_temp_dir() + "/absent.safetensors";
  auto file = SafetensorsFile::open(path);
  ASSERT_FALSE(file.is_ok());
  EXPECT_EQ(file.status().code(), StatusCode::kIoError);
  EXPECT_NE(file.status().message().find(path), std::string::npos);
}

TEST(SafetensorsRead, OpenEmptyAndShortFilesAreErrors) {
  const std::string dir = make_temp_dir();
  for (size_t n : {0, 1, 7}) {
    const std::string path = dir + "/short" + std::to_string(n) + ".safetensors";
    write_file_bytes(path, std::vector<uint8_t>(n, 0));
    auto file = SafetensorsFile::open(path);
    ASSERT_FALSE(file.is_ok());
    EXPECT_EQ(file.status().code(), StatusCode::kInvalidWeights);
    EXPECT_NE(file.status().message().find(path), std::string::npos);
    EXPECT_NE(file.status().message().find(std::to_string(n) + " bytes"), std::string::npos);
  }
}

TEST(SafetensorsRead, OpenDirectoryIsAnError) {
  auto file = SafetensorsFile::open(make_temp_dir());
  ASSERT_FALSE(file.is_ok());
  EXPECT_EQ(file.status().code(), StatusCode::kIoError);
}

TEST(SafetensorsRead, OpenReportsHeaderErrorsWithThePath) {
  const std::string path = make_temp_dir() + "/bad.safetensors";
  write_file_bytes(path, make_raw(R"({"w":{"dtype":"F64","shape":[],"data_offsets":[0,8]}})", 8));
  auto file = SafetensorsFile::open(path);
  ASSERT_FALSE(file.is_ok());
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidWeights);
  EXPECT_EQ(file.status().message().rfind(path + ": tensor 'w': dtype 'F64'", 0), 0u)
      << file.status().message();
}

TEST(SafetensorsBadInput, HeaderLengthPastTheEnd) {
  std::vector<uint8_t> bytes = u64_le(1000);
  bytes.insert(bytes.end(), {'{', '}'});
  expect_invalid(bytes, {"header length 1000", "10 bytes"});
}

TEST(SafetensorsBadInput, HeaderLengthMaxU64) {
  std::vector<uint8_t> bytes = u64_le(~uint64_t{0});
  bytes.insert(bytes.end(), {'{', '}'});
  expect_invalid(bytes, {"header length 18446744073709551615"});
}

TEST(SafetensorsBadInput, MalformedJson) {
  expect_invalid(R"({"w": {"dtype": )", 0, {"not valid JSON"});
  expect_invalid("", 0, {"not valid JSON"});
  expect_invalid(std::string("{\"\xff\":1}"), 0, {"not valid JSON"});
}

TEST(SafetensorsBadInput, DeeplyNestedJson) { expect_invalid(std::string(100000, '['), 0, {"nests deeper"}); }

TEST(SafetensorsBadInput, TopLevelNotAnObject) {
  expect_invalid("[1, 2]", 0, {"not a JSON object"});
  expect_invalid("42", 0, {"not a JSON object"});
}

TEST(SafetensorsBadInput, EntryNotAnObject) {
  expect_invalid(R"({"w": 3})", 0, {"tensor 'w'", "not an object"});
}

TEST(SafetensorsBadInput, UnknownOrMissingDtype) {
  expect_invalid(R"({"model.w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8,
                 {"tensor 'model.w'", "dtype 'F64'"});
  expect_invalid(R"({"w":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", 4,
                 {"tensor 'w'", "dtype 'f32'"});
  expect_invalid(R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", 4, {"tensor 'w'", "dtype 7"});
  expect_invalid(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4, {"tensor 'w'", "missing 'dtype'"});
}

TEST(SafetensorsBadInput, BadShapeEntries) {
  expect_invalid(R"({"w":{"dtype":"U8","shape":[2,-1],"data_offsets":[0,0]}})", 0,
                 {"tensor 'w'", "shape[1] = -1"});
  expect_invalid(R"({"w":{"dtype":"U8","shape":[2.5],"data_offsets":[0,2]}})", 2,
                 {"tensor 'w'", "shape[0] = 2.5"});
  expect_invalid(R"({"w":{"dtype":"U8","shape":["2"],"data_offsets":[0,2]}})", 2,
                 {"tensor 'w'", "shape[0] = \"2\""});
  expect_invalid(R"({"w":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,2]}})", 2,
                 {"tensor 'w'", "shape[0] = 9223372036854775808"});
  expect_invalid(R"({"w":{"dtype":"U8","shape":2,"data_offsets":[0,2]}})", 2, {"tensor 'w'", "shape 2"});
  expect_invalid(R"({"w":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})",
                 1, {"tensor 'w'", "rank 17"});
}

TEST(SafetensorsBadInput, ShapeOverflow) {
  expect_invalid(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0,
                 {"tensor 'w'", "overflows"});
  // numel fits int64 but numel * 8 does not fit u64: must be a clean mismatch, not a wraparound.
  expect_invalid(R"({"w":{"dtype":"I64","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0,
                 {"tensor 'w'", "4611686018427387904 elements"});
}

TEST(SafetensorsBadInput, DataOffsetsPastTheEnd) {
  auto file = parse(make_raw(R"({"model.w":{"dtype":"U8","shape":[99],"data_offsets":[0,99]}})", 64));
  ASSERT_FALSE(file.is_ok());
  EXPECT_EQ(file.status().message(),
            "mem.safetensors: tensor 'model.w': data_offsets [0, 99] end past the data section (64 bytes)");
  expect_invalid(
      R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551615,18446744073709551615]}})", 4,
      {"tensor 'w'", "end past the data section"});
}

TEST(SafetensorsBadInput, DataOffsetsMalformed) {
  expect_invalid(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1,
                 {"tensor 'w'", "data_offsets [0]"});
  expect_invalid(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", 2,
                 {"tensor 'w'", "data_offsets"});
  expect_invalid(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", 1, {"tensor 'w'", "[-1,0]"});
  expect_invalid(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1.0]}})", 1,
                 {"tensor 'w'", "data_offsets"});
  expect_invalid(R"({"w":{"dtype":"U8","shape":[1]}})", 1, {"tensor 'w'", "missing 'data_offsets'"});
}

TEST(SafetensorsBadInput, DataOffsetsBeginAfterEnd) {
  expect_invalid(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}})", 16,
                 {"tensor 'w'", "data_offsets [8, 4] begin after end"});
}

TEST(SafetensorsBadInput, SizeMismatchWithShape) {
  expect_invalid(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 16,
                 {"tensor 'w'", "data_offsets [0, 12]", "12 bytes", "[2, 2]"});
  expect_invalid(R"({"w":{"dtype":"F32","shape":[],"data_offsets":[0,5]}})", 8, {"tensor 'w'", "5 bytes"});
}

TEST(SafetensorsBadInput, OverlappingTensors) {
  expect_invalid(R"({"a":{"dtype":"U8","shape":[16],"data_offsets":[0,16]},
                     "b":{"dtype":"U8","shape":[16],"data_offsets":[8,24]}})",
                 24, {"'a' data_offsets [0, 16]", "'b' data_offsets [8, 24]", "overlap"});
  // A long tensor overlapping a later one past a short one in between.
  expect_invalid(R"({"long":{"dtype":"U8","shape":[32],"data_offsets":[0,32]},
                     "x":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},
                     "y":{"dtype":"U8","shape":[4],"data_offsets":[16,20]}})",
                 32, {"'long'", "'y'", "overlap"});
  expect_invalid(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
                     "b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                 4, {"'a'", "'b'", "overlap"});
}

TEST(SafetensorsBadInput, BadMetadata) {
  expect_invalid(R"({"__metadata__": [1]})", 0, {"__metadata__", "not an object"});
  expect_invalid(R"({"__metadata__": {"k": 1}})", 0, {"__metadata__ 'k'", "not a string"});
}

TEST(SafetensorsBadInput, EveryTruncationIsAnErrorExceptTheFullFile) {
  const std::vector<uint8_t> full = small_valid_file();
  ASSERT_GT(full.size(), 64u);
  for (size_t n = 0; n <= full.size(); ++n) {
    auto file = parse(std::vector<uint8_t>(full.begin(), full.begin() + static_cast<ptrdiff_t>(n)));
    if (n == full.size()) {
      ASSERT_TRUE(file.is_ok()) << file.status().to_string();
      EXPECT_EQ((*file)->entries().size(), 2u);
    } else {
      ASSERT_FALSE(file.is_ok()) << "truncated to " << n;
      EXPECT_EQ(file.status().code(), StatusCode::kInvalidWeights);
      EXPECT_EQ(file.status().message().rfind(kOrigin, 0), 0u);
    }
  }
}

TEST(SafetensorsBadInput, EveryBitFlipIsHandled) {
  const std::vector<uint8_t> full = small_valid_file();
  for (size_t i = 0; i < full.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::vector<uint8_t> bytes = full;
      bytes[i] ^= static_cast<uint8_t>(1u << bit);
      auto file = parse(std::move(bytes));
      if (file.is_ok()) {
        touch_all(**file);
      } else {
        EXPECT_EQ(file.status().code(), StatusCode::kInvalidWeights) << "byte " << i << " bit " << bit;
      }
    }
  }
}

TEST(SafetensorsWrite, MissingDirectoryIsIoErrorAndLeavesNoFile) {
  const std::string path = make_temp_dir() + "/no/such/dir/w.safetensors";
  Status s = write_safetensors(path, {{"w", patterned(DType::kF32, {2}, 0)}});
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find(path), std::string::npos);
  EXPECT_FALSE(file_exists(path));
  EXPECT_FALSE(file_exists(path + ".tmp"));
}

TEST(SafetensorsWrite, RejectsDuplicateAndReservedNames) {
  const std::string dir = make_temp_dir();
  Status dup = write_safetensors(
      dir + "/d.safetensors", {{"w", patterned(DType::kU8, {1}, 0)}, {"w", patterned(DType::kU8, {1}, 0)}});
  EXPECT_EQ(dup.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(dup.message().find("'w'"), std::string::npos);
  Status reserved =
      write_safetensors(dir + "/r.safetensors", {{"__metadata__", patterned(DType::kU8, {1}, 0)}});
  EXPECT_EQ(reserved.code(), StatusCode::kInvalidArgument);
  Status utf8 = write_safetensors(dir + "/u.safetensors", {{"\xff", patterned(DType::kU8, {1}, 0)}});
  EXPECT_EQ(utf8.code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(file_exists(dir + "/d.safetensors"));
}

TEST(SafetensorsWrite, OverwritesAnExistingFile) {
  const std::string path = make_temp_dir() + "/w.safetensors";
  write_file_bytes(path, {1, 2, 3});
  ASSERT_TRUE(write_safetensors(path, {{"w", patterned(DType::kI32, {2}, 0)}}).is_ok());
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  EXPECT_EQ((*file)->entries().count("w"), 1u);
}

TEST(SafetensorsDTypeName, AllNames) {
  EXPECT_STREQ(safetensors_dtype_name(DType::kF32), "F32");
  EXPECT_STREQ(safetensors_dtype_name(DType::kF16), "F16");
  EXPECT_STREQ(safetensors_dtype_name(DType::kBF16), "BF16");
  EXPECT_STREQ(safetensors_dtype_name(DType::kI32), "I32");
  EXPECT_STREQ(safetensors_dtype_name(DType::kI64), "I64");
  EXPECT_STREQ(safetensors_dtype_name(DType::kU8), "U8");
  EXPECT_STREQ(safetensors_dtype_name(DType::kU32), "U32");
  EXPECT_STREQ(safetensors_dtype_name(DType::kBool), "BOOL");
}

}  // namespace
}  // namespace switchboard
