// ReplicaReader: reads byte ranges of files that exist as byte-identical replicas under N drive
// roots (root_i/rel_path). Each range is cut into chunks; each chunk goes to the drive with the
// earliest estimated finish (queued bytes / EWMA of measured bytes/s), a chunk that is overdue
// is hedged on another drive, and a chunk whose drive fails (I/O error, the file vanished or was
// unlinked mid-read) is retried on another replica. A drive that failed once is not used again.
// Only when no replica remains does a read fail, with a Status naming every drive's error.
//
// Invariant (hedging): a hedged chunk is read by two drives into the same destination. Replicas
// are byte-identical (the store's identity hash is checked on open), so the late read stores the
// bytes already there; the reader tracks such stragglers and waits for them before the same
// memory is read into again (read()) or handed back (drain()). Not thread-safe: one caller at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "storage/aligned_buffer.h"
#include "storage/io_engine.h"

namespace fb::storage {

struct ReaderOptions {
  bool use_uring = true;
  bool use_direct = true;              // O_DIRECT; files where it is refused (tmpfs) fall back per file
  uint32_t chunk_bytes = 1u << 20;
  int queue_depth_per_drive = 8;
  double prior_bytes_per_s = 2e9;      // until the first measurement (probe can seed real rates)
  double ewma_alpha = 0.2;
  double hedge_factor = 4.0;           // hedge a chunk after factor x its expected time ...
  int64_t hedge_min_us = 2000;         // ... but never before this
  bool hedge = true;
  // Test hooks (fault injection), never set in production paths.
  std::function<void(int drive, uint64_t n_completed)> on_complete;
};

struct ReadRange {
  std::string path;   // relative to each drive root
  uint64_t offset = 0;
  uint64_t nbytes = 0;
  uint8_t* dst = nullptr;  // nbytes of room; direct into it when offset, nbytes and dst are 4 KiB aligned
};

struct DriveStats {
  std::string root;
  double bytes_per_s = 0;
  uint64_t bytes_read = 0;
  uint64_t n_reads = 0;
  uint64_t n_errors = 0;
  uint64_t n_hedges = 0;      // hedges issued to this drive
  uint64_t n_hedges_won = 0;
  bool failed = false;
  std::string last_error;
};

class ReplicaReader {
 public:
  static Result<std::unique_ptr<ReplicaReader>> open(std::vector<std::string> roots, ReaderOptions opt = {});
  ~ReplicaReader();

  // Reads every range completely (or fails). Ranges may be unaligned (bounced through an
  // aligned buffer) and may name different files.
  Status read(const std::vector<ReadRange>& ranges);
  // Waits until no straggling hedged read targets [p, p+n).
  Status drain(const void* p, size_t n);

  int n_drives() const { return int(drives_.size()); }
  DriveStats stats(int drive) const;
  void set_rate(int drive, double bytes_per_s);
  // Fault injection: the drive's next ops after `after_n` more completions fail with `err`.
  void inject_error(int drive, uint64_t after_n, int err = 5 /* EIO */);
  const char* engine_name() const { return engine_->name(); }

 private:
  struct Drive {
    std::string root;
    double rate = 0;
    uint64_t queued_bytes = 0;
    int in_flight = 0;
    uint64_t last_done_ns = 0;
    uint64_t n_completed = 0;
    int64_t inject_after = -1;
    int inject_err = 0;
    std::map<std::string, int> fds;  // rel path -> fd
    std::map<std::string, bool> direct;
    DriveStats stats;
  };
  struct Chunk {
    int range = 0;
    uint64_t file_offset = 0;
    uint32_t nbytes = 0;
    uint8_t* dst = nullptr;
    uint32_t tried = 0;     // bitmask of drives tried
    int flights = 0;        // reads of it in flight
    bool done = false;
    bool hedged = false;
    uint64_t deadline_ns = 0;
    std::string errors;
  };
  struct Flight {
    int chunk = -1;         // -1: a straggler (its chunk completed elsewhere)
    int drive = 0;
    int fd = -1;
    uint64_t submit_ns = 0;
    uint32_t nbytes = 0;
    uint8_t* dst = nullptr;
    bool hedge = false;
    std::shared_ptr<AlignedBuffer> keep;  // bounce buffer a straggler may still write
  };

  ReplicaReader(std::vector<std::string> roots, ReaderOptions opt, std::unique_ptr<IoEngine> engine);
  Result<int> fd_for(int drive, const std::string& path, bool* direct);
  int pick_drive(const Chunk& c, bool hedge) const;
  Status issue(std::vector<Chunk>& chunks, int ci, const std::vector<ReadRange>& ranges, bool hedge);
  Status pump(std::vector<Chunk>* chunks, const std::vector<ReadRange>* ranges, int64_t timeout_us);
  void fail_drive(int drive, const std::string& why);

  ReaderOptions opt_;
  std::unique_ptr<IoEngine> engine_;
  std::vector<Drive> drives_;
  std::map<uint64_t, Flight> flights_;  // by tag
  uint64_t next_tag_ = 1;
  std::vector<std::shared_ptr<AlignedBuffer>> bounce_;  // per range of the current read
};

}  // namespace fb::storage
