// MappedFile: read-only mmap of a whole file (checkpoint shards are never read eagerly).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/status.h"

namespace fb {

class MappedFile {
 public:
  MappedFile() = default;
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;

  static Result<MappedFile> open(const std::string& path);

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Whole small file (configs, fixtures) into memory.
Result<std::string> read_file_bytes(const std::string& path);
// Atomic write: temp file, fsync, rename, fsync dir. Nothing half-written survives a crash.
Status write_file_atomic(const std::string& path, const void* data, size_t n);

}  // namespace fb
