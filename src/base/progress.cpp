#include "base/progress.h"

#include <atomic>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace fb {

namespace {

std::string printf_str(const char* fmt, double v) {
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

// Decimal byte scale for a magnitude: {divisor, name, printf format}.
struct ByteScale {
  double div;
  const char* name;
  const char* fmt;
};
ByteScale byte_scale(double magnitude) {
  if (magnitude >= 1e9) return {1e9, "GB", "%.2f"};
  if (magnitude >= 1e6) return {1e6, "MB", "%.1f"};
  if (magnitude >= 1e3) return {1e3, "kB", "%.0f"};
  return {1, "B", "%.0f"};
}

std::string format_seconds(double s) {
  if (s < 1) return printf_str("%.2f s", s);
  if (s < 60) return printf_str("%.1f s", s);
  return Progress::format_eta(s);
}

}  // namespace

namespace {
std::atomic<ProgressOptions::Mode> g_default{ProgressOptions::Mode::kAuto};
}  // namespace

void set_progress_default(ProgressOptions::Mode mode) { g_default.store(mode, std::memory_order_relaxed); }

bool progress_enabled(ProgressOptions::Mode mode, std::FILE* out) {
  if (mode == ProgressOptions::Mode::kOn) return true;
  if (mode == ProgressOptions::Mode::kOff) return false;
  const ProgressOptions::Mode d = g_default.load(std::memory_order_relaxed);
  if (d != ProgressOptions::Mode::kAuto) return d == ProgressOptions::Mode::kOn;
  return isatty(fileno(out ? out : stderr)) != 0;
}

Progress::Progress(std::string phase, int64_t total, std::string count_name, ProgressOptions opt)
    : phase_(std::move(phase)), count_name_(std::move(count_name)), unit_(ProgressUnit::kCount), total_(total) {
  init(std::move(opt));
}

Progress::Progress(std::string phase, int64_t total, ProgressUnit unit, ProgressOptions opt)
    : phase_(std::move(phase)), unit_(unit), total_(total) {
  init(std::move(opt));
}

void Progress::init(ProgressOptions opt) {
  opt_ = std::move(opt);
  // A sink replaces the stream, so only the mode decides (auto with a sink: the real stderr's state).
  enabled_ = progress_enabled(opt_.mode, opt_.out);
  start_ = last_draw_ = now();
}

Progress::~Progress() {
  if (enabled_ && !finished_) clear();
}

double Progress::now() const {
  if (opt_.clock) return opt_.clock();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Progress::write(const std::string& s) {
  if (opt_.sink) {
    opt_.sink(s);
    return;
  }
  std::FILE* f = opt_.out ? opt_.out : stderr;
  std::fputs(s.c_str(), f);
  std::fflush(f);
}

void Progress::set_items_total(int64_t total, std::string name) {
  std::lock_guard<std::mutex> lk(mu_);
  items_total_ = total;
  items_name_ = std::move(name);
}

void Progress::set_total(int64_t total) {
  std::lock_guard<std::mutex> lk(mu_);
  total_ = total;
}

std::string Progress::format_eta(double s) {
  if (!(s >= 0) || !std::isfinite(s)) return "?";
  if (s < 60) return printf_str("%.0f s", std::ceil(s));
  const int64_t t = int64_t(std::llround(s));
  char b[64];
  if (t < 3600)
    std::snprintf(b, sizeof b, "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  else
    std::snprintf(b, sizeof b, "%lldh%02lldm", (long long)(t / 3600), (long long)(t % 3600 / 60));
  return b;
}

std::string Progress::format_amount(int64_t v) const {
  if (unit_ == ProgressUnit::kBytes) {
    const ByteScale sc = byte_scale(double(total_ > 0 ? total_ : v));
    return printf_str(sc.fmt, double(v) / sc.div);
  }
  return std::to_string(v);
}

std::string Progress::unit_name() const {
  if (unit_ == ProgressUnit::kBytes) return byte_scale(double(total_ > 0 ? total_ : done_)).name;
  return count_name_;
}

std::string Progress::format_rate(double per_s) const {
  if (unit_ == ProgressUnit::kBytes) {
    const ByteScale sc = byte_scale(per_s);
    return printf_str(sc.fmt, per_s / sc.div).append(" ").append(sc.name).append("/s");
  }
  const char* fmt = per_s >= 100 ? "%.0f" : per_s >= 10 ? "%.1f" : "%.2f";
  return printf_str(fmt, per_s).append(" ").append(count_name_).append("/s");
}

void Progress::draw_locked(double t) {
  const double el = t - start_;
  std::string s;
  s.append("\r").append(phase_).append(": ").append(format_amount(done_));
  if (total_ > 0) s.append("/").append(format_amount(total_));
  s.append(" ").append(unit_name());
  if (total_ > 0) s.append(printf_str(" (%.0f%%)", 100.0 * double(done_) / double(total_)));
  const double rate = el > 0 ? double(done_) / el : 0;
  if (rate > 0) {
    s.append(", ").append(format_rate(rate));
    if (total_ > 0 && done_ < total_) s.append(", ETA ").append(format_eta(double(total_ - done_) / rate));
  }
  if (!items_name_.empty()) {
    s.append(", ").append(std::to_string(items_done_));
    if (items_total_ > 0) s.append("/").append(std::to_string(items_total_));
    s.append(" ").append(items_name_);
  }
  s.append("\033[K");
  write(s);
  line_open_ = true;
  last_draw_ = t;
}

void Progress::update(int64_t done, int64_t items_done) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lk(mu_);
  update_locked(done, items_done);
}

void Progress::add(int64_t n) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lk(mu_);
  update_locked(done_ + n, -1);
}

void Progress::update_locked(int64_t done, int64_t items_done) {
  if (finished_) return;
  done_ = done;
  if (items_done >= 0) items_done_ = items_done;
  const double t = now();
  if (t - last_draw_ >= opt_.min_interval_s) draw_locked(t);
}

void Progress::finish() {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (finished_) return;
  finished_ = true;
  if (done_ == 0 && !line_open_) return;  // a phase with nothing done leaves no line
  const double el = now() - start_;
  std::string s;
  s.append("\r").append(phase_).append(": ").append(format_amount(done_)).append(" ").append(unit_name());
  s.append(" in ").append(format_seconds(el));
  if (el > 0 && done_ > 0) s.append(" (").append(format_rate(double(done_) / el)).append(")");
  if (!items_name_.empty()) s.append(", ").append(std::to_string(items_done_)).append(" ").append(items_name_);
  s.append("\033[K\n");
  write(s);
  line_open_ = false;
}

void Progress::clear() {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lk(mu_);
  finished_ = true;
  if (line_open_) write("\r\033[K");
  line_open_ = false;
}

void Progress::hide() {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (line_open_) write("\r\033[K");
  line_open_ = false;
}

void PhaseProgress::report(const std::string& phase, int64_t done, int64_t total, const std::string& unit) {
  if (!p_ || phase != phase_) {
    finish();
    phase_ = phase;
    p_ = std::make_unique<Progress>(phase, total, unit, opt_);
  }
  p_->set_total(total);
  p_->update(done);
  if (total > 0 && done >= total) finish();  // its final line before the caller's own lines
}

void PhaseProgress::finish() {
  if (p_) p_->finish();
  p_.reset();
  phase_.clear();
}

void PhaseProgress::hide() {
  if (p_) p_->hide();
}

}  // namespace fb
