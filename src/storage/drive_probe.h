// Drive rate probe: O_DIRECT read rates of one directory's drive, measured on a scratch file
// (written, fsynced, read with io_uring at a fixed queue depth, deleted). Feeds `flashbox probe`
// and seeds ReplicaReader's per-drive estimates.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace fb::storage {

struct DriveRates {
  std::string dir;
  std::string engine;          // io_uring or pread
  bool direct = false;         // O_DIRECT accepted
  uint64_t file_bytes = 0;
  double seq_bytes_per_s = 0;    // 1 MiB reads in order, queue depth 8
  double rand1m_bytes_per_s = 0; // 1 MiB reads at random aligned offsets, queue depth 8
  double rand4k_bytes_per_s = 0; // 4 KiB reads at random aligned offsets, queue depth 32
  double rand4k_iops() const { return rand4k_bytes_per_s / 4096.0; }
};

Result<DriveRates> probe_drive(const std::string& dir, uint64_t file_bytes, double seconds_each);

}  // namespace fb::storage
