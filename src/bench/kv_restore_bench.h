// Disk KV cache restore vs prefill (issue 21's device acceptance): for each context, a session at
// that context (really prefilled, or fake-filled with the prefill time estimated from chunks) is
// saved (Executor::save_session), written to a file with fsync, dropped from the page cache where
// the kernel allows, read back and restored into a fresh session, each step timed; the bytes on
// disk per token are set against spec/12's figure for the config. [policy] benchmark-only.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "base/progress.h"
#include "base/status.h"
#include "cuda/executor.h"
#include "model/step.h"

namespace fb::bench {

// spec/12 §1: the context-proportional bytes per token of the compact caches (compressed KV and
// index keys of every KV source) and the fixed part of a snapshot (window and draft rings of
// `window` slots, one pending (k, g) f32 pair per ratio-2 layer, Engram history, position).
struct SpecStateBytes {
  double per_token = 0;
  double fixed = 0;
};
SpecStateBytes spec_state_bytes(const model::Config& c);

struct KvRestoreOptions {
  std::vector<int64_t> contexts;
  std::string dir;              // where the state files are written (removed afterwards)
  bool full_prefill = true;     // prefill every context for real (its state is saved); else fake-fill
                                // and estimate the prefill from chunks at four context frontiers
  int64_t prefill_chunk = 2048;
  int reps = 3;                 // save and restore: median of this many
  ProgressFn progress;          // tokens of each context's prefill (optional)
};

struct KvRestorePoint {
  int64_t context = 0;
  uint64_t state_bytes = 0;     // the saved state = the file's size
  double save_ms = 0;           // save_session (device -> host bytes)
  double write_ms = 0;          // open, write, fsync, close
  double read_ms = 0;           // open, read, close
  double resident_before_read = -1;  // share of the file's pages in the page cache before the read (0: cold; -1: unknown)
  double restore_ms = 0;        // restore_session into a fresh session (host bytes -> device)
  double parse_ms = 0;          // of which the host validation (cpu::parse_session_layout, checksum included)
  double prefill_s = 0;         // the same context's prefill
  bool prefill_measured = true; // false: estimated from chunk rates (KvRestoreOptions::full_prefill off)
  bool roundtrip_equal = false; // the restored session saves the same bytes
};

// The prefill step of rows [s0, s1) of an `end`-token prompt (the bench's synthetic prompt).
using PrefillStepFn = std::function<model::Step(int64_t s0, int64_t s1, int64_t end)>;

// Runs every context of `o` on `ex`; `note` receives one human-readable line per context.
Result<std::vector<KvRestorePoint>> run_kv_restore(cuda::CudaExecutor& ex, const KvRestoreOptions& o, const PrefillStepFn& step,
                                                   const std::function<void(const std::string&)>& note);

// The CSV rows of the points: row(name, context, value, unit, limit share or -1).
using RowFn = std::function<void(const std::string& name, int64_t context, double value, const char* unit, double share)>;
void report_kv_restore(const std::vector<KvRestorePoint>& pts, const model::Config& c, double h2d_pageable_gbps, const RowFn& row);

// Whether `dir` lies on a tmpfs (RAM: "disk" rates there are memory rates, and nothing is cold).
bool dir_on_tmpfs(const std::string& dir);

}  // namespace fb::bench
