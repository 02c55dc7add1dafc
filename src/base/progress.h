// Progress of long work on a terminal (issue 24): one status line on stderr, redrawn in place at
// most ~10 times a second, with the phase, done/total in the phase's unit, the rate and the ETA,
// then one final line. When stderr is not a terminal (CI logs, pipes, files) nothing at all is
// written (a command may override that for the process: set_progress_default; no environment
// variable is read); unit tests force them with ProgressOptions and read them through a sink with
// an injected clock.
//
//   Progress p("load weights", total_bytes, ProgressUnit::kBytes);
//   p.set_items_total(n_tensors, "tensors");
//   for (...) p.update(bytes_done, tensors_done);
//   p.finish();   // "load weights: 4.56 GB in 3.0 s (1.52 GB/s), 1400 tensors"
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace fb {

enum class ProgressUnit {
  kCount,  // a named count: tensors, layers, steps, tokens (the name is the unit string)
  kBytes,  // bytes, shown as kB / MB / GB (decimal) chosen from the total
};

struct ProgressOptions {
  enum class Mode {
    kAuto,  // on when the output is a terminal (unless set_progress_default overrides)
    kOn,    // always (tests)
    kOff,   // never
  };
  Mode mode = Mode::kAuto;
  std::FILE* out = nullptr;                      // nullptr: stderr
  std::function<void(std::string_view)> sink;    // tests: gets each write instead of `out`
  std::function<double()> clock;                 // seconds, monotonic; empty: steady_clock
  double min_interval_s = 0.1;                   // at most one redraw per interval
};

// Process-wide meaning of kAuto: kAuto (follow the terminal), kOn or kOff. For a command-line flag
// of main's, never read from the environment (issue 19: no getenv below main).
void set_progress_default(ProgressOptions::Mode mode);

// Whether progress lines would be drawn on `out` (stderr when null) under `mode`.
bool progress_enabled(ProgressOptions::Mode mode = ProgressOptions::Mode::kAuto, std::FILE* out = nullptr);

class Progress {
 public:
  // `unit`: kCount with `count_name` ("tensors", "layers", "steps", "tokens"), or kBytes.
  // total <= 0: unknown (no percentage, no ETA).
  Progress(std::string phase, int64_t total, std::string count_name, ProgressOptions opt = {});
  Progress(std::string phase, int64_t total, ProgressUnit unit, ProgressOptions opt = {});
  // Unfinished (an error path): the open line is erased, nothing else is written.
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  bool enabled() const { return enabled_; }
  // A second counter shown after the main one ("120/1400 tensors").
  void set_items_total(int64_t total, std::string name);
  void set_total(int64_t total);
  // Absolute progress (items_done < 0: keep the last). Redraws when min_interval_s has passed
  // since the last draw (or since the start). Thread-safe.
  void update(int64_t done, int64_t items_done = -1);
  void add(int64_t n = 1);
  // The final line ("PHASE: DONE UNIT in T (RATE)"), once; later calls do nothing. A phase that
  // did nothing (0 done, nothing drawn) leaves no line.
  void finish();
  // Erases the open line without a final line (the prefill line before the answer streams).
  void clear();
  // Erases the open line before other output goes to the terminal; the next due update() draws
  // it again.
  void hide();

  // Formatting, exposed for tests.
  static std::string format_eta(double seconds);
  std::string format_amount(int64_t v) const;   // in the phase's unit, without the unit name
  std::string unit_name() const;                // "GB", "MB", "tensors", ...
  std::string format_rate(double per_s) const;  // "1.52 GB/s", "5.2 tensors/s"

 private:
  void init(ProgressOptions opt);
  double now() const;
  void write(const std::string& s);
  void draw_locked(double t);
  void update_locked(int64_t done, int64_t items_done);

  std::string phase_, count_name_, items_name_;
  ProgressUnit unit_;
  int64_t total_ = 0, done_ = 0, items_total_ = 0, items_done_ = 0;
  bool enabled_ = false, finished_ = false, line_open_ = false;
  ProgressOptions opt_;
  double start_ = 0, last_draw_ = 0;
  std::mutex mu_;
};

// Progress of work that lives below the command (bench loops in src/bench, the engine's session
// rounds), reported through one callback: report(phase, done, total, unit) draws `phase`'s line,
// writes its final line when done reaches total, and a phase of another name first finishes the
// line before it. Loops take a ProgressFn (empty:
// nothing reported); the command owns a PhaseProgress and hands them fn().
using ProgressFn = std::function<void(const std::string& phase, int64_t done, int64_t total, const std::string& unit)>;

class PhaseProgress {
 public:
  explicit PhaseProgress(ProgressOptions opt = {}) : opt_(std::move(opt)) {}
  void report(const std::string& phase, int64_t done, int64_t total, const std::string& unit);
  void finish();  // the open phase's final line
  void hide();    // before other lines go to the same terminal
  ProgressFn fn() {
    return [this](const std::string& phase, int64_t done, int64_t total, const std::string& unit) { report(phase, done, total, unit); };
  }

 private:
  ProgressOptions opt_;
  std::string phase_;
  std::unique_ptr<Progress> p_;
};

}  // namespace fb
