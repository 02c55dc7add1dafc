// Drive rate probe: O_DIRECT read rates of one directory's drive, measured on a scratch file
// (written, fsynced, read with io_uring at a fixed queue depth, deleted). Feeds `flashbox probe`
// and seeds ReplicaReader's per-drive estimates.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "storage/replica_reader.h"

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
// record_bytes > 0: each dir's reads walk whole records (block-sized chunks in order from a
// random record-aligned offset, the last chunk of a record shorter), as the reader reads a miss.
Result<double> probe_drives_together(const std::vector<std::string>& dirs, uint64_t file_bytes, double seconds, uint32_t block,
                                     int depth_per_dir, uint64_t record_bytes = 0,
                                     const std::function<void(size_t, uint64_t, uint32_t)>& on_read = {});

// The expert reader's read shape, taken from its options (one constant: ReaderOptions'
// chunk_bytes and queue_depth_per_drive), with the record size the plan reads per miss.
struct DriveProbeShape {
  uint32_t block = 0;
  int depth_per_dir = 0;
  uint64_t record_bytes = 0;
  // Test hook: each read as it is submitted (dir index, file offset, bytes).
  std::function<void(size_t dir, uint64_t offset, uint32_t nbytes)> on_read;
};
DriveProbeShape reader_probe_shape(const ReaderOptions& ro, uint64_t record_bytes);
// The expert reader's pattern (reader_probe_shape); the file grows to hold >= 4 records.
Result<double> probe_drives_together(const std::vector<std::string>& dirs, uint64_t file_bytes, double seconds, const DriveProbeShape& shape);

// Records that already lie in files, one file per replica dir: DIR/experts.fbx (a store written
// by `flashbox convert`; its records from data_start()) or DIR/records.bin (the drive bench's flat
// record file, storage/record_file.h, from offset 0). The same base and count in every file (the
// smallest count when they differ).
struct RecordFiles {
  std::vector<std::string> paths;
  uint64_t base = 0;          // the first record's offset
  uint64_t n_records = 0;     // records from base
  uint64_t record_bytes = 0;  // one record (the store's stride; records.bin: the record size asked for)
};
// DIR/experts.fbx when present (validated as ExpertStore::open does), else DIR/records.bin of
// record_bytes records; an error names a dir that has neither or a file with no whole record.
Result<RecordFiles> record_files_in(const std::vector<std::string>& dirs, uint64_t record_bytes);
// The expert reader's pattern (shape: chunk and depth per file; shape.record_bytes is replaced by
// the files') on those files, read together for `seconds`, O_DIRECT where the file system allows,
// nothing written: the rate the drive tier gets from these very bytes (their devices, their
// place on them and whatever caches them), which a fresh scratch file need not show.
Result<double> probe_record_files(const RecordFiles& files, double seconds, const DriveProbeShape& shape);

}  // namespace fb::storage
