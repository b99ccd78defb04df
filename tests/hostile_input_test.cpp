// Hostile files and values (issue #19): each input a probe of the CLI found crashing or
// hanging gets a clean error naming the file, and a test here. A hang fails by ctest's
// timeout; a crash fails the test binary.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "safetensors.h"
#include "switchboard/model.h"
#include "switchboard/switchboard.h"

namespace switchboard {
namespace {

std::string temp_dir() {
  static const std::string dir = [] {
    std::string tmpl = ::testing::TempDir() + "/sb_hostile_XXXXXX";
    EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
    return tmpl;
  }();
  return dir;
}

// A FIFO nobody writes to: opening it for reading blocks unless the reader refuses it first.
std::string fifo(const std::string& name) {
  const std::string path = temp_dir() + "/" + name;
  EXPECT_EQ(mkfifo(path.c_str(), 0600), 0) << path;
  return path;
}

std::string deep_json(const std::string& key, int depth) {
  return "{\"model_type\": \"qwen3_moe\", \"" + key + "\": " + std::string(static_cast<size_t>(depth), '[') +
         std::string(static_cast<size_t>(depth), ']') + "}";
}

void expect_error(const Status& st, const std::string& needle) {
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
  EXPECT_LT(st.message().size(), 400u) << "the message echoes too much";
}

TEST(HostileInput, DeeplyNestedConfigValuesAreRefusedBeforeParsing) {
  for (const char* key : {"hidden_size", "mlp_only_layers"})
    expect_error(models::parse_hf_config_text(deep_json(key, 100000), "deep/config.json").status(),
                 "deep/config.json: JSON nested deeper than 64 levels");
  // Brackets inside strings do not count.
  const std::string in_string = "{\"model_type\": \"" + std::string(1000, '[') + "\"}";
  expect_error(models::parse_hf_config_text(in_string, "s/config.json").status(), "s/config.json: vocab_size");
}

TEST(HostileInput, DeeplyNestedBitMapIsRefused) {
  models::ExportFormat f;
  expect_error(models::parse_bit_map(std::string(100000, '[') + std::string(100000, ']'), "map.json", &f),
               "map.json: JSON nested deeper than 64 levels");
}

TEST(HostileInput, EchoedValuesAreClipped) {
  const std::string big = "{\"model_type\": \"qwen3_moe\", \"vocab_size\": \"" + std::string(10 << 20, 'x') + "\"}";
  expect_error(models::parse_hf_config_text(big, "big/config.json").status(), "big/config.json: vocab_size: must be");
}

TEST(HostileInput, FifosAreRefusedWithoutBlocking) {
  expect_error(Program::load(fifo("program.sbp")).status(), "not a regular file");
  expect_error(models::parse_hf_config(fifo("config.json")).status(), "not a regular file");
  expect_error(SafetensorsFile::open(fifo("weights.safetensors")).status(), "not a regular file");
  models::ExportFormat f;
  expect_error(models::read_bit_map(fifo("map.json"), &f), "not a regular file");
}

TEST(HostileInput, DevicesAndDirectoriesAreNotPrograms) {
  expect_error(Program::load("/dev/zero").status(), "program /dev/zero: not a regular file");
  expect_error(Program::load(temp_dir()).status(), "not a regular file");
  expect_error(Program::load("").status(), "empty path");
}

}  // namespace
}  // namespace switchboard
