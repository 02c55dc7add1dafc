// Test helper: one official fixture (../shared/fixtures/NAME) on the CPU executor, with its prompt.
// `model` stays null when the fixture is absent, so tests can skip.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "base/mapped_file.h"
#include "cpu/executor.h"

namespace fb::testing_util {

struct CpuFixture {
  std::unique_ptr<cpu::CpuModel> model;
  std::vector<int32_t> prompt;
};

inline CpuFixture load_cpu_fixture(const char* name) {
  CpuFixture f;
  const std::string dir = std::string(FB_SHARED_DIR) + "/fixtures/" + name;
  if (!std::filesystem::exists(dir)) return f;
  auto m = cpu::CpuModel::load(dir + "/checkpoint");
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return f;
  f.model = std::move(m.value());
  auto b = read_file_bytes(dir + "/prompt.i32");
  EXPECT_TRUE(b.ok());
  if (!b.ok()) return f;
  f.prompt.resize(b->size() / 4);
  std::memcpy(f.prompt.data(), b->data(), b->size());
  return f;
}

}  // namespace fb::testing_util
