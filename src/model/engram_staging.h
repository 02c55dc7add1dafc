// Engram rows fetched ahead of their layers (MISSION item 7, issue 22), for both executors.
//
// A step's Engram table rows are known once its token ids are hashed (spec/11 §6.3), before any
// layer runs, and the tables are too large for HBM in the release (189 GiB): they are read from
// the mapped snapshot, i.e. the page cache or the drive behind it. EngramStaging copies each
// Engram layer's rows (codes and scales, unchanged) out of the tables into compact buffers, in
// tasks started when the ids are known, layer after layer, while the layers before them run;
// the layer's op then reads the copies (the same bytes as the tables: numerics do not change).
// Rows are claimed one at a time from a per-layer counter, so a layer that comes before the tasks
// reached its rows copies the rest itself instead of waiting for a thread the scheduler has not
// run yet; several tasks put several page faults (drive reads) in flight at once. The tasks are
// worker threads the object keeps from step to step (an executor owns one object), so a decode
// step starts no thread.
//
// Accounting (model::EngramRows): a row staged before its layer asked counts as hidden, the others
// as exposed, with the time the layer spent copying or waiting for them.
//
// Tables on drives (issue 22): a table with a `source` is not read through the mapping but
// through an EngramRowSource (storage::EngramRowCache: a hot-row cache in host RAM over direct
// reads of the snapshot's shards on one or more replica drives), a step row's columns in one call
// so their reads are in flight together. The bytes are the table's: the numerics do not change.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/status.h"
#include "model/executor_stats.h"

namespace fb::model {

// Rows of Engram tables from somewhere other than mapped memory (the drives behind a row cache).
class EngramRowSource {
 public:
  virtual ~EngramRowSource() = default;
  // Copies rows ids[0 .. n) of `layer`'s table: codes [n, head_dim] e4m3, scales [n, head_dim / 32]
  // e8m0 (the ids are valid rows; the staging checked them). Thread-safe: several staging tasks
  // call it at once. An error means no replica could supply a row.
  virtual Status read_rows(int layer, const int64_t* ids, int n, uint8_t* codes, uint8_t* scales) const = 0;
  // Host memory it holds for rows (the cache), and the bytes it has read from the drives so far
  // (the rows' bytes), for the executors' memory ledger.
  virtual uint64_t host_bytes() const { return 0; }
  virtual uint64_t drive_bytes_read() const { return 0; }
};

class EngramStaging {
 public:
  // One Engram layer's table: rows x head_dim e4m3 codes and rows x head_dim / 32 e8m0 scales,
  // and which table of the step's row ids it reads.
  struct Table {
    const uint8_t* codes = nullptr;
    const uint8_t* scales = nullptr;
    int64_t rows = 0;
    int index = 0;  // the table's position in the row ids' [rows, tables, cols] layout
    // Set: the rows come from here (codes / scales are then not read), asked for as `layer`'s.
    const EngramRowSource* source = nullptr;
    int layer = -1;
  };
  // Layer k's staged rows: codes [T * cols, head_dim], scales [T * cols, head_dim / 32], row-major
  // by (step row, col).
  struct Rows {
    const uint8_t* codes = nullptr;
    const uint8_t* scales = nullptr;
  };

  EngramStaging() = default;
  ~EngramStaging();  // stops the workers
  EngramStaging(const EngramStaging&) = delete;
  EngramStaging& operator=(const EngramStaging&) = delete;

  // Starts staging for one step (after waiting for the previous step's tasks): `ids` [T,
  // n_tables, cols] (spec/11 §6.3 row ids; kept by pointer: it must stay valid until join()
  // returns, see Guard), `layers` the step's Engram layers in the order they run. `tasks` workers
  // copy ahead (0: none, every row is copied by its layer, all exposed; the object starts more
  // workers when asked for more, and keeps them). Every id is checked against its table first
  // (kInternal naming the first bad one).
  Status start(std::vector<Table> layers, const int64_t* ids, int64_t T, int n_tables, int cols, int head_dim, int tasks);

  // Layer k's rows (k in start's order), copying or waiting for what is not staged yet; counts
  // into `count` when not null. A source's read error makes the step's status() an error (the
  // rows it could not read are then zero bytes: the caller must fail the step).
  Rows rows(size_t k, EngramRows* count);
  // The first read error of the current step (Status() when every row was read).
  Status status() const;

  size_t layers() const { return tables_.size(); }
  // Layer k's staging buffers whole (valid once rows(k, ...) has returned): callers that copy
  // them on (an upload) take the vectors instead of the pointers.
  const std::vector<uint8_t>& codes(size_t k) const { return codes_[k]; }
  const std::vector<uint8_t>& scales(size_t k) const { return scales_[k]; }
  // Waits until the workers are done with this step's rows (they stop once every row is staged).
  void join();

  // Joins at the end of a step's scope: a step that owns the ids declares its guard after them,
  // so the workers are done before the ids go away, also when the step fails half way.
  class Guard {
   public:
    explicit Guard(EngramStaging& s) : s_(s) {}
    ~Guard() { s_.join(); }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    EngramStaging& s_;
  };

 private:
  void stage(size_t k);  // claims and copies rows of layer k until none is left
  void worker(int index);

  std::vector<Table> tables_;
  const int64_t* ids_ = nullptr;
  int64_t T_ = 0;
  int n_tables_ = 0, cols_ = 0, hd_ = 0;
  std::vector<std::vector<uint8_t>> codes_, scales_;
  std::unique_ptr<std::atomic<int32_t>[]> claimed_, staged_;
  mutable std::mutex error_mu_;
  Status error_;  // the step's first read error (error_mu_)
  // The workers: a step is a generation; workers 0 .. want_ - 1 stage it, active_ of them not done.
  std::mutex mu_;
  std::condition_variable wake_, idle_;
  uint64_t gen_ = 0;
  int want_ = 0, active_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace fb::model
