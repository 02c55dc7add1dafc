// Test helper: the built-in tiny model (loader::write_tiny_model) in a temporary folder with a stub
// Engram token map (token t -> class t mod classes: every class used, as validation wants), for tests that need
// a model beyond the fixtures (long outputs, the smooth model of the numerics gates).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "base/mapped_file.h"
#include "base/status.h"
#include "loader/tiny_model.h"

namespace fb::testing_util {

inline Result<std::string> write_test_tiny_model(const std::string& name, uint64_t seed, bool smooth) {
  const std::string dir = (std::filesystem::temp_directory_path() / (name + "_" + std::to_string(getpid()))).string();
  loader::TinyModelOptions o;
  o.out_dir = dir;
  o.seed = seed;
  o.smooth = smooth;
  FB_RETURN_IF_ERROR(loader::write_tiny_model(o));
  std::vector<int32_t> map(size_t(o.vocab_size));
  for (int64_t t = 0; t < o.vocab_size; ++t) map[size_t(t)] = int32_t(t % o.engram_compressed_vocab);
  FB_RETURN_IF_ERROR(write_file_atomic(dir + "/engram_token_map.i32", map.data(), map.size() * sizeof(int32_t)));
  return dir;
}

}  // namespace fb::testing_util
