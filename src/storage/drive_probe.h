// Drive rate probe: O_DIRECT read rates of one directory's drive, measured on a scratch file
// (written, fsynced, read with io_uring at a fixed queue depth, deleted). Feeds `flashbox probe`
// and seeds ReplicaReader's per-drive estimates.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

// The expert reader's pattern on every dir at once (ReplicaOptions: chunk_bytes reads at random
// aligned offsets, queue_depth_per_drive in flight per replica dir): one scratch file per dir,
// all read together for `seconds`; the combined bytes/s. This is the rate the drive tier draws
// when its replicas share a device (two dirs on one disk) or do not, where the sum of
// probe_drive's one-dir rates is right only for separate devices whose rate does not grow with
// depth (issue 22: one cloud disk gave 1.0 GB/s per dir alone and ~2.0 GB/s under two replicas).
Result<double> probe_drives_together(const std::vector<std::string>& dirs, uint64_t file_bytes, double seconds, uint32_t block,
                                     int depth_per_dir);

}  // namespace fb::storage
