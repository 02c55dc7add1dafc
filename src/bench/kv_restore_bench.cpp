#include "bench/kv_restore_bench.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "bench/fake_context.h"
#include "model/session_layout.h"

namespace fb::bench {

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Status io_error(const std::string& what, const std::string& path) {
  return FB_ERROR(kIo) << what << " " << path << ": " << std::strerror(errno);
}

// All n bytes at p through `op` (::read or ::write on fd), restarting after EINTR. Returns the bytes
// moved: fewer than n after an error (errno says which) or at the end of the file (errno 0).
template <typename Op, typename Byte>
size_t transfer_all(int fd, Op op, Byte* p, size_t n) {
  size_t done = 0;
  while (done < n) {
    const ssize_t k = op(fd, p + done, n - done);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) errno = 0;
    if (k <= 0) break;
    done += size_t(k);
  }
  return done;
}

// Writes `b` to `path` and makes it durable (fsync), then asks the kernel to drop its pages from
// the page cache (clean after the fsync, so DONTNEED can drop them).
Status write_durable(const std::string& path, const std::string& b) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return io_error("cannot create", path);
  if (transfer_all(fd, ::write, b.data(), b.size()) < b.size()) {
    Status st = io_error("cannot write", path);
    ::close(fd);
    return st;
  }
  if (::fsync(fd) != 0) {
    Status st = io_error("cannot fsync", path);
    ::close(fd);
    return st;
  }
  ::close(fd);
  return Status();
}

void drop_cached(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Share of the file's pages resident in the page cache (mincore on a mapping; -1 if unknown).
double resident_share(const std::string& path, size_t size) {
  if (size == 0) return -1;
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return -1;
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return -1;
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> v((size + page - 1) / page);
  double share = -1;
  if (::mincore(p, size, v.data()) == 0) {
    size_t n = 0;
    for (unsigned char c : v) n += c & 1;
    share = double(n) / double(v.size());
  }
  ::munmap(p, size);
  return share;
}

Status read_all(const std::string& path, std::string& b) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return io_error("cannot open", path);
  const size_t done = transfer_all(fd, ::read, b.data(), b.size());
  if (done < b.size()) {
    const bool at_end = errno == 0;
    Status st = io_error("cannot read", path);
    if (at_end) st = FB_ERROR(kIo) << "short read of " << path << " (" << done << " of " << b.size() << " bytes)";
    ::close(fd);
    return st;
  }
  ::close(fd);
  return Status();
}

Status run_prefill(cuda::CudaExecutor& ex, model::SessionState& s, int64_t L, int64_t chunk, const PrefillStepFn& step,
                   const std::function<void(int64_t)>& on_chunk = {}) {
  std::vector<model::SessionState*> ss{&s};
  for (int64_t s0 = s.n_pos(); s0 < L; s0 += chunk) {
    FB_TRY(ex.forward(step(s0, std::min(L, s0 + chunk), L), ss));
    if (on_chunk) on_chunk(std::min(L, s0 + chunk));
  }
  return Status();
}

// Prefill seconds of an L-token prompt from chunk rates: the context split in four quarters, each
// at the rate of one chunk ending at its middle (midpoint rule; earlier context fake-filled).
Result<double> estimate_prefill_s(cuda::CudaExecutor& ex, int64_t L, int64_t chunk, const PrefillStepFn& step) {
  double sec = 0;
  for (int q = 0; q < 4; ++q) {
    const int64_t end = std::max<int64_t>(1, (2 * q + 1) * L / 8);
    const int64_t C = std::min(chunk, end);
    auto s = ex.new_session();
    FB_RETURN_IF_ERROR(fill_fake_context(ex, static_cast<cuda::CudaSession&>(*s), end - C, uint64_t(end) + 29));
    std::vector<model::SessionState*> ss{s.get()};
    const double t0 = now_ms();
    FB_TRY(ex.forward(step(end - C, end, end), ss));
    sec += double(L) / 4 / (double(C) / ((now_ms() - t0) * 1e-3));
  }
  return sec;
}

}  // namespace

SpecStateBytes spec_state_bytes(const model::Config& c) {
  SpecStateBytes b;
  const double row = double(c.head_dim + c.head_dim / 32), kv = double(c.head_dim / 2 + c.head_dim / 16),
               key = double(c.index_head_dim / 2 + c.index_head_dim / 32);
  for (int l = 0; l < c.n_layers; ++l) {
    const auto& r = c.roles[size_t(l)];
    if (!r.kv_source) continue;
    b.per_token += (kv + key) / r.ratio;
    if (r.ratio == 2) b.fixed += 2.0 * c.head_dim * 4;  // the pending (k, g) pair, f32
  }
  b.fixed += double(c.n_layers + c.n_mtp_layers) * c.window_size * row;  // window and draft rings
  b.fixed += 3 * 4 + 8;                                                   // Engram history, position
  return b;
}

bool dir_on_tmpfs(const std::string& dir) {
  struct statfs f {};
  return ::statfs(dir.c_str(), &f) == 0 && f.f_type == 0x01021994;  // TMPFS_MAGIC
}

Result<std::vector<KvRestorePoint>> run_kv_restore(cuda::CudaExecutor& ex, const KvRestoreOptions& o, const PrefillStepFn& step,
                                                   const std::function<void(const std::string&)>& note) {
  std::vector<KvRestorePoint> out;
  {
    // Warm-up: grows the step workspace and the RoPE tables, so the first context's prefill
    // does not pay for it.
    auto w = ex.new_session();
    FB_RETURN_IF_ERROR(run_prefill(ex, *w, std::min<int64_t>(o.prefill_chunk, 512), o.prefill_chunk, step));
  }
  for (int64_t L : o.contexts) {
    KvRestorePoint pt;
    pt.context = L;
    auto s = ex.new_session();
    if (o.full_prefill) {
      const std::string phase = "bench kv restore: prefill " + std::to_string(L);
      if (o.progress) o.progress(phase, 0, L, "tokens");
      const double t0 = now_ms();
      FB_RETURN_IF_ERROR(run_prefill(ex, *s, L, o.prefill_chunk, step, [&](int64_t done) {
        if (o.progress) o.progress(phase, done, L, "tokens");
      }));
      pt.prefill_s = (now_ms() - t0) * 1e-3;
    } else {
      pt.prefill_measured = false;
      pt.prefill_s = FB_TRY(estimate_prefill_s(ex, L, o.prefill_chunk, step));
      FB_RETURN_IF_ERROR(fill_fake_context(ex, static_cast<cuda::CudaSession&>(*s), L, uint64_t(L)));
    }
    std::string bytes;
    std::vector<double> save_ms;
    for (int r = 0; r < std::max(1, o.reps); ++r) {
      const double t0 = now_ms();
      bytes = FB_TRY(ex.save_session(*s));
      save_ms.push_back(now_ms() - t0);
    }
    pt.save_ms = median(save_ms);
    pt.state_bytes = bytes.size();
    const std::string path = o.dir + "/flashbox-kv-restore-" + std::to_string(::getpid()) + "-" + std::to_string(L) + ".state";
    double t0 = now_ms();
    Status st = write_durable(path, bytes);
    pt.write_ms = now_ms() - t0;
    std::string back(bytes.size(), '\0');  // allocated (and touched) outside the timed read
    if (st.ok()) {
      drop_cached(path);
      pt.resident_before_read = resident_share(path, bytes.size());
      t0 = now_ms();
      st = read_all(path, back);
      pt.read_ms = now_ms() - t0;
    }
    ::unlink(path.c_str());
    FB_RETURN_IF_ERROR(st);
    if (back != bytes) return FB_ERROR(kIo) << path << ": read back other bytes than written";
    bytes.clear();
    bytes.shrink_to_fit();
    std::vector<double> restore_ms;
    for (int r = 0; r < std::max(1, o.reps); ++r) {
      auto fresh = ex.new_session();
      t0 = now_ms();
      FB_RETURN_IF_ERROR(ex.restore_session(*fresh, back));
      restore_ms.push_back(now_ms() - t0);
      if (r == 0) {
        auto again = ex.save_session(*fresh);
        pt.roundtrip_equal = again.ok() && *again == back;
      }
    }
    pt.restore_ms = median(restore_ms);
    std::vector<double> parse_ms;
    for (int r = 0; r < std::max(1, o.reps); ++r) {
      t0 = now_ms();
      const bool ok = model::parse_session_layout(ex.config(), back, ex.identity()).ok();
      parse_ms.push_back(now_ms() - t0);
      if (!ok) return FB_ERROR(kInternal) << "the saved state at context " << L << " does not parse";
    }
    pt.parse_ms = median(parse_ms);
    char line[320];
    std::snprintf(line, sizeof line,
                  "context %lld: state %.1f MB; save %.1f ms, write+fsync %.1f ms, read %.1f ms (%s), restore %.1f ms; prefill %.2f s (%s)",
                  (long long)L, double(pt.state_bytes) / 1e6, pt.save_ms, pt.write_ms, pt.read_ms,
                  pt.resident_before_read < 0 ? "page cache state unknown"
                                              : (pt.resident_before_read == 0 ? "cold" : "partly or fully cached"),
                  pt.restore_ms, pt.prefill_s, pt.prefill_measured ? "measured" : "estimated from chunk rates");
    note(line);
    out.push_back(pt);
  }
  return out;
}

void report_kv_restore(const std::vector<KvRestorePoint>& pts, const model::Config& c, double h2d_pageable_gbps, const RowFn& row) {
  const SpecStateBytes spec = spec_state_bytes(c);
  const double empty = double(model::session_layout(c, 0).total_bytes);  // our state at position 0
  for (const KvRestorePoint& p : pts) {
    const int64_t L = p.context;
    const double B = double(p.state_bytes), restore_total_ms = p.read_ms + p.restore_ms;
    row("kv_state_mb", L, B / 1e6, "MB in the state file (session_save bytes)", -1);
    row("kv_disk_bytes_per_token", L, (B - empty) / double(L), "B/token on disk beyond the empty state (share: of spec/12's figure for these dims)",
        (B - empty) / double(L) / spec.per_token);
    row("kv_spec_bytes_per_token", L, spec.per_token, "B/token, spec/12's compact caches for these dims", -1);
    row("kv_disk_bytes_per_token_all", L, B / double(L), "B/token, whole file / context (share: of spec/12's whole snapshot)",
        B / (spec.per_token * double(L) + spec.fixed));
    row("kv_save_ms", L, p.save_ms, "ms, save_session (device -> host bytes), median", -1);
    row("kv_write_ms", L, p.write_ms, "ms, write + fsync of the state file", -1);
    row("kv_write_gbps", L, B / (p.write_ms * 1e-3) / 1e9, "GB/s, write + fsync", -1);
    row("kv_read_ms", L, p.read_ms, "ms, read of the state file", -1);
    row("kv_read_gbps", L, B / (p.read_ms * 1e-3) / 1e9, "GB/s, read", -1);
    row("kv_read_resident_before", L, p.resident_before_read,
        "share of the file's pages cached before the read after fsync + POSIX_FADV_DONTNEED (0: a cold read; -1: unknown)", -1);
    row("kv_restore_ms", L, p.restore_ms, "ms, restore_session from host bytes into a fresh session, median", -1);
    row("kv_restore_gbps", L, B / (p.restore_ms * 1e-3) / 1e9, "GB/s of state restored (share: of the measured pageable H2D rate)",
        h2d_pageable_gbps > 0 ? B / (p.restore_ms * 1e-3) / 1e9 / h2d_pageable_gbps : -1);
    row("kv_restore_parse_ms", L, p.parse_ms, "ms of the restore validating the bytes on the host (checksum included), median", -1);
    row("kv_read_restore_ms", L, restore_total_ms, "ms, file read + restore", -1);
    row("kv_prefill_s", L, p.prefill_s, p.prefill_measured ? "s, the same context prefilled (measured)" : "s, prefill estimated from chunk rates at four frontiers", -1);
    row("kv_restore_speedup", L, p.prefill_s / (restore_total_ms * 1e-3), "x, prefill time / (read + restore) time", -1);
    row("kv_roundtrip_equal", L, p.roundtrip_equal ? 1.0 : 0.0, "1 = the restored session saves the same bytes", -1);
  }
}

}  // namespace fb::bench
