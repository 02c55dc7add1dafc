// ReplicaReader: reads byte ranges of files that exist as byte-identical replicas under N drive
// roots (root_i/rel_path). Each range is cut into chunks; each chunk goes to the drive with the
// earliest estimated finish (queued bytes / EWMA of measured bytes/s), a chunk that is overdue
// (hedge_factor x its drive's expected time) is hedged on another drive and whichever read lands
// first wins, and a chunk whose drive fails (I/O error, the file vanished, was unlinked or
// truncated mid-read) is retried on another replica. A drive that failed once is not used again.
// Only when no replica remains does a read fail, with a Status naming every drive's error.
//
// Reads are asynchronous: submit() queues a job's chunks with the kernel (io_uring) and returns
// at once; wait(job) drives every job's completions, retries and hedges until that job is whole.
// read() is submit + wait. Progress (retries, hedges) happens only inside wait()/poll(); the
// kernel reads meanwhile.
//
// Invariant (hedging): a hedged chunk is read by two drives into the same destination. Replicas
// are byte-identical (the store's identity hash is checked on open), so the late read stores the
// bytes already there; the reader tracks such stragglers and waits for them before the same
// memory is read into again (submit()) or handed back (drain()). Not thread-safe: one caller at a time.
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
  // The caller calls drain() before it reuses or frees a destination: wait() then returns as soon
  // as every chunk has landed once, without waiting for the slower reads of hedged chunks (which
  // store the same bytes again). Off: wait() also waits for those (the safe default).
  bool caller_drains = false;
  // Test hooks (fault injection), never set in production paths.
  std::function<void(int drive, uint64_t n_completed)> on_complete;
};

// Fault injection (tests, and `check-fixture --fault-replica` to show failover on a real run):
// after `after` completed reads of drive `drive`, its replica of the file being read is unlinked
// or truncated to half its size (the real file: later reads see what a vanished or truncated
// replica gives), or each later read of that drive fails with EIO, or (kDelay) each completion of
// that drive is reported `delay_us` late (a slow drive; the bytes are correct).
struct ReaderFault {
  enum class Kind { kNone, kEio, kUnlink, kTruncate, kDelay };
  Kind kind = Kind::kNone;
  int drive = 0;
  uint64_t after = 0;
  int64_t delay_us = 0;
};
// "DRIVE@AFTER:KIND" with KIND eio|unlink|truncate, or "DRIVE@AFTER:delay=US".
Result<ReaderFault> parse_reader_fault(const std::string& s);

struct ReadRange {
  std::string path;   // relative to each drive root
  uint64_t offset = 0;
  uint64_t nbytes = 0;
  uint8_t* dst = nullptr;  // nbytes of room; direct into it when offset, nbytes and dst are 4 KiB aligned
};

// A drive's read rate: the bytes its reads delivered over the time it was busy delivering them
// (each read counts the time since its submission or the drive's previous completion, whichever is
// later: 0 for reads reaped together), taken over windows of at least 2 ms of busy time, then an
// EWMA over the windows. Not a mean of per-read rates: reads that land in a burst have near-zero
// gaps, and such a mean (the estimator before session 20) read 2.7-11 GB/s from a 1 GB/s disk on
// the H200, so reads queued behind 16 MiB were hedged after 2 ms, adding 29% more reads to the disk
// (docs/tiers.md).
struct RateEstimate {
  double alpha = 0.2;
  double window_ns = 2e6;
  double pending_bytes = 0, pending_ns = 0;  // the open window
  double rate = 0;                           // bytes/s, once a window has closed
  bool started = false;
  void add(double nbytes, double busy_ns) {
    pending_bytes += nbytes;
    pending_ns += busy_ns;
    if (pending_ns < window_ns) return;
    const double sample = pending_bytes * 1e9 / pending_ns;
    rate = started ? (1 - alpha) * rate + alpha * sample : sample;
    started = true;
    pending_bytes = pending_ns = 0;
  }
  bool valid() const { return started; }
  double bytes_per_s() const { return rate; }
};

struct DriveStats {
  std::string root;
  double bytes_per_s = 0;
  uint64_t bytes_read = 0;
  uint64_t n_reads = 0;
  uint64_t n_errors = 0;
  uint64_t n_hedges = 0;      // hedges issued to this drive
  uint64_t n_hedges_won = 0;
  uint64_t n_late = 0;        // reads that landed after another drive had already served the chunk
  bool failed = false;
  std::string last_error;
};

class ReplicaReader {
 public:
  static Result<std::unique_ptr<ReplicaReader>> open(std::vector<std::string> roots, ReaderOptions opt = {});
  ~ReplicaReader();

  using Job = uint64_t;
  // Starts reading every range (ranges may be unaligned: bounced through an aligned buffer; they
  // may name different files). `only_drive` >= 0: read from that drive alone (no hedge, no
  // retry elsewhere), to tell which replica holds bad bytes. The destinations belong to the
  // reader until wait(job) returns.
  Result<Job> submit(const std::vector<ReadRange>& ranges, int only_drive = -1);
  // Drives all jobs until `job` is complete (every byte in place) or has failed.
  Status wait(Job job);
  // Non-blocking progress; true when `job` is finished (wait() then returns at once).
  bool poll(Job job);
  // submit + wait.
  Status read(const std::vector<ReadRange>& ranges, int only_drive = -1);
  // Waits until no read in flight (a straggler or an unfinished job) targets [p, p+n).
  Status drain(const void* p, size_t n);
  // Marks a drive failed (e.g. its bytes failed a checksum); it gets no further reads.
  void mark_failed(int drive, const std::string& why);
  // Wall time callers spent blocked in wait()/read() (the exposed read time).
  uint64_t wait_ns() const { return wait_ns_; }

  int n_drives() const { return int(drives_.size()); }
  DriveStats stats(int drive) const;
  void set_rate(int drive, double bytes_per_s);
  // Fault injection: the drive's next ops after `after_n` more completions fail with `err`.
  void inject_error(int drive, uint64_t after_n, int err = 5 /* EIO */);
  void inject(const ReaderFault& f);
  const char* engine_name() const { return engine_->name(); }

 private:
  struct Drive {
    std::string root;
    double rate = 0;
    bool measured = false;           // rate is a measurement (else the prior or set_rate's)
    RateEstimate est;
    uint64_t queued_bytes = 0;
    int in_flight = 0;
    uint64_t last_done_ns = 0;
    uint64_t n_completed = 0;
    int64_t inject_after = -1;
    int inject_err = 0;
    ReaderFault fault;               // kUnlink / kTruncate / kDelay (kEio goes through inject_after)
    bool fault_done = false;
    uint64_t delay_free_ns = 0;      // kDelay: when the simulated slow drive is free again
    std::map<std::string, int> fds;  // rel path -> fd
    std::map<std::string, bool> direct;
    std::map<std::string, int64_t> size_at_open;  // a replica that shrinks later was truncated
    DriveStats stats;
  };
  struct Chunk {
    int range = 0;
    uint32_t deny = 0;      // drives this chunk may not use (only_drive jobs)
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
  struct JobState {
    std::vector<ReadRange> ranges;
    std::vector<Chunk> chunks;
    std::vector<std::shared_ptr<AlignedBuffer>> bounce;  // per range, for unaligned ones
    size_t n_done = 0;
    Status status;
  };
  struct Flight {
    Job job = 0;            // 0: a straggler (its chunk completed elsewhere, or its job ended)
    Job from_job = 0;       // the job it was issued for
    int chunk = -1;
    int drive = 0;
    int fd = -1;
    const std::string* path = nullptr;  // key of the drive's fds map
    uint64_t submit_ns = 0;
    uint32_t nbytes = 0;
    uint8_t* dst = nullptr;
    bool hedge = false;
    std::shared_ptr<AlignedBuffer> keep;  // bounce buffer a straggler may still write
  };

  ReplicaReader(std::vector<std::string> roots, ReaderOptions opt, std::unique_ptr<IoEngine> engine);
  Result<int> fd_for(int drive, const std::string& path, bool* direct);
  int pick_drive(const Chunk& c) const;
  Status issue(Job job, int ci, bool hedge);
  // Issues every chunk of every job that is neither done nor in flight; fails jobs with no replica left.
  Status issue_pending();
  Status issue_hedges();
  // Microseconds to the earliest hedge deadline or delayed completion (-1: none).
  int64_t next_event_us() const;
  Status pump(int64_t timeout_us);
  void complete(const IoDone& io, uint64_t t);
  void fail_drive(int drive, const std::string& why);
  void apply_fault(Drive& d, const Flight& f);

  ReaderOptions opt_;
  std::unique_ptr<IoEngine> engine_;
  std::vector<Drive> drives_;
  std::map<uint64_t, Flight> flights_;  // by tag
  std::map<Job, JobState> jobs_;        // unfinished jobs
  struct Held {                          // a completion a kDelay fault reports late
    uint64_t release_ns = 0;
    IoDone io;
  };
  std::vector<Held> held_;
  uint64_t next_tag_ = 1;
  Job next_job_ = 1;
  uint64_t wait_ns_ = 0;
};

}  // namespace fb::storage
