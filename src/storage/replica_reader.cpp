#include "storage/replica_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>

#include "base/check.h"
#include "base/log.h"

namespace fb::storage {

namespace {

uint64_t now_ns() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

bool aligned(uint64_t v) { return v % kDirectAlign == 0; }

}  // namespace

Result<std::unique_ptr<ReplicaReader>> ReplicaReader::open(std::vector<std::string> roots, ReaderOptions opt) {
  if (roots.empty()) return FB_ERROR(kInvalidArgument) << "no drive roots given";
  if (roots.size() > 32) return FB_ERROR(kInvalidArgument) << "at most 32 replica drives";
  FB_CHECK(opt.chunk_bytes % kDirectAlign == 0) << "chunk_bytes must be 4 KiB aligned";
  const unsigned entries = unsigned(std::max(8, opt.queue_depth_per_drive * int(roots.size()) * 2));
  auto engine = make_io_engine(opt.use_uring, entries);
  return std::unique_ptr<ReplicaReader>(new ReplicaReader(std::move(roots), std::move(opt), std::move(engine)));
}

ReplicaReader::ReplicaReader(std::vector<std::string> roots, ReaderOptions opt, std::unique_ptr<IoEngine> engine)
    : opt_(std::move(opt)), engine_(std::move(engine)) {
  for (auto& r : roots) {
    Drive d;
    d.root = r;
    d.rate = opt_.prior_bytes_per_s;
    d.stats.root = r;
    drives_.push_back(std::move(d));
  }
}

ReplicaReader::~ReplicaReader() {
  jobs_.clear();
  for (auto& [tag, f] : flights_) f.job = 0;
  while (!flights_.empty())
    if (!pump(-1).ok()) break;
  for (Drive& d : drives_)
    for (auto& [p, fd] : d.fds) ::close(fd);
}

DriveStats ReplicaReader::stats(int drive) const {
  DriveStats s = drives_.at(size_t(drive)).stats;
  s.bytes_per_s = drives_[size_t(drive)].rate;
  return s;
}

void ReplicaReader::set_rate(int drive, double bytes_per_s) {
  Drive& d = drives_.at(size_t(drive));
  d.rate = bytes_per_s;
  d.measured = true;  // a probe's figure: measurements blend into it
}

void ReplicaReader::inject_error(int drive, uint64_t after_n, int err) {
  Drive& d = drives_.at(size_t(drive));
  d.inject_after = int64_t(d.n_completed + after_n);
  d.inject_err = err;
}

void ReplicaReader::inject(const ReaderFault& f) {
  Drive& d = drives_.at(size_t(f.drive));
  if (f.kind == ReaderFault::Kind::kEio) {
    inject_error(f.drive, f.after);
    return;
  }
  d.fault = f;
  d.fault_done = false;
  d.fault.after += d.n_completed;
}

Result<ReaderFault> parse_reader_fault(const std::string& s) {
  ReaderFault f;
  const size_t at = s.find('@'), colon = s.find(':');
  if (at == std::string::npos || colon == std::string::npos || colon < at)
    return FB_ERROR(kInvalidArgument) << "fault \"" << s << "\": want DRIVE@AFTER:eio|unlink|truncate|delay=US";
  try {
    f.drive = std::stoi(s.substr(0, at));
    f.after = std::stoull(s.substr(at + 1, colon - at - 1));
    const std::string k = s.substr(colon + 1);
    if (k == "eio") f.kind = ReaderFault::Kind::kEio;
    else if (k == "unlink") f.kind = ReaderFault::Kind::kUnlink;
    else if (k == "truncate") f.kind = ReaderFault::Kind::kTruncate;
    else if (k.rfind("delay=", 0) == 0) {
      f.kind = ReaderFault::Kind::kDelay;
      f.delay_us = std::stoll(k.substr(6));
    } else {
      return FB_ERROR(kInvalidArgument) << "fault \"" << s << "\": unknown kind \"" << k << "\"";
    }
  } catch (const std::exception&) {
    return FB_ERROR(kInvalidArgument) << "fault \"" << s << "\": want DRIVE@AFTER:eio|unlink|truncate|delay=US";
  }
  if (f.drive < 0) return FB_ERROR(kInvalidArgument) << "fault \"" << s << "\": negative drive";
  return f;
}

void ReplicaReader::mark_failed(int drive, const std::string& why) { fail_drive(drive, why); }

void ReplicaReader::fail_drive(int drive, const std::string& why) {
  Drive& d = drives_[size_t(drive)];
  ++d.stats.n_errors;
  d.stats.last_error = why;
  if (!d.stats.failed) {
    FB_LOG(kWarn) << "storage: drive " << d.root << " failed (" << why << "); reading from the other replicas";
  }
  d.stats.failed = true;
}

Result<int> ReplicaReader::fd_for(int drive, const std::string& path, bool* direct) {
  Drive& d = drives_[size_t(drive)];
  auto it = d.fds.find(path);
  if (it != d.fds.end()) {
    *direct = d.direct[path];
    return it->second;
  }
  const std::string full = d.root + "/" + path;
  int fd = -1;
  bool dir = false;
  if (opt_.use_direct) {
    fd = ::open(full.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    dir = fd >= 0;
  }
  if (fd < 0 && (!opt_.use_direct || errno == EINVAL)) fd = ::open(full.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return FB_ERROR(kIo) << full << ": " << std::strerror(errno);
  d.fds[path] = fd;
  d.direct[path] = dir;
  struct stat st;
  d.size_at_open[path] = fstat(fd, &st) == 0 ? int64_t(st.st_size) : 0;
  *direct = dir;
  return fd;
}

int ReplicaReader::pick_drive(const Chunk& c) const {
  int best = -1;
  double best_t = 0;
  bool any_untried = false;
  for (int i = 0; i < n_drives(); ++i) {
    const Drive& d = drives_[size_t(i)];
    if (d.stats.failed || ((c.tried | c.deny) & (1u << i))) continue;
    any_untried = true;
    if (d.in_flight >= opt_.queue_depth_per_drive) continue;
    const double t = double(d.queued_bytes + c.nbytes) / std::max(1.0, d.rate);
    if (best < 0 || t < best_t) {
      best = i;
      best_t = t;
    }
  }
  if (best < 0) return any_untried ? -2 : -1;
  return best;
}

Status ReplicaReader::issue(Job job, int ci, bool hedge) {
  JobState& j = jobs_.at(job);
  Chunk& c = j.chunks[size_t(ci)];
  for (;;) {
    if (engine_->in_flight() >= engine_->capacity()) return Status();
    const int d = pick_drive(c);
    if (d < 0) return Status();  // the caller tells "busy" (-2) from "no replica left" (-1)
    c.tried |= 1u << d;
    const std::string& path = j.ranges[size_t(c.range)].path;
    bool direct = false;
    auto fd = fd_for(d, path, &direct);
    if (!fd.ok()) {
      fail_drive(d, fd.status().message());
      c.errors += "\n  " + fd.status().message();
      continue;
    }
    Drive& dr = drives_[size_t(d)];
    const uint64_t t0 = now_ns();
    const double expect_s = double(dr.queued_bytes + c.nbytes) / std::max(1.0, dr.rate);
    const uint64_t tag = next_tag_++;
    Flight f;
    f.job = job;
    f.from_job = job;
    f.chunk = ci;
    f.drive = d;
    f.fd = *fd;
    f.path = &dr.fds.find(path)->first;
    f.submit_ns = t0;
    f.nbytes = c.nbytes;
    f.dst = c.dst;
    f.hedge = hedge;
    f.keep = j.bounce[size_t(c.range)];
    FB_RETURN_IF_ERROR(engine_->submit({*fd, c.file_offset, c.nbytes, c.dst, tag}));
    flights_.emplace(tag, std::move(f));
    ++c.flights;
    dr.queued_bytes += c.nbytes;
    ++dr.in_flight;
    if (hedge) {
      c.hedged = true;
      ++dr.stats.n_hedges;
    }
    c.deadline_ns = t0 + uint64_t(std::max<double>(double(opt_.hedge_min_us) * 1e3, opt_.hedge_factor * expect_s * 1e9));
    return Status();
  }
}

Status ReplicaReader::issue_pending() {
  for (auto& [id, j] : jobs_) {
    if (!j.status.ok()) continue;
    for (size_t i = 0; i < j.chunks.size(); ++i) {
      Chunk& c = j.chunks[i];
      if (c.done || c.flights > 0) continue;
      FB_RETURN_IF_ERROR(issue(id, int(i), false));
      if (c.flights == 0 && pick_drive(c) == -1) {
        const ReadRange& r = j.ranges[size_t(c.range)];
        j.status = FB_ERROR(kIo) << "reading " << r.path << " [" << c.file_offset << ", +" << c.nbytes << "): no replica left of "
                                 << n_drives() << " drive(s):" << (c.errors.empty() ? std::string(" all failed") : c.errors);
        break;
      }
    }
  }
  return Status();
}

Status ReplicaReader::issue_hedges() {
  if (!opt_.hedge || n_drives() < 2) return Status();
  const uint64_t t = now_ns();
  for (auto& [id, j] : jobs_) {
    if (!j.status.ok()) continue;
    for (size_t i = 0; i < j.chunks.size(); ++i) {
      Chunk& c = j.chunks[i];
      if (!c.done && c.flights > 0 && !c.hedged && t >= c.deadline_ns && pick_drive(c) >= 0) FB_RETURN_IF_ERROR(issue(id, int(i), true));
    }
  }
  return Status();
}

int64_t ReplicaReader::next_event_us() const {
  const uint64_t t = now_ns();
  int64_t best = -1;
  auto take = [&](uint64_t at) {
    const int64_t us = at > t ? int64_t((at - t) / 1000) + 1 : 0;
    best = best < 0 ? us : std::min(best, us);
  };
  if (opt_.hedge && n_drives() > 1)
    for (const auto& [id, j] : jobs_)
      if (j.status.ok())
        for (const Chunk& c : j.chunks)
          if (!c.done && c.flights > 0 && !c.hedged && pick_drive(c) != -1) take(c.deadline_ns);
  for (const Held& h : held_) take(h.release_ns);
  return best;
}

void ReplicaReader::apply_fault(Drive& d, const Flight& f) {
  using K = ReaderFault::Kind;
  if (d.fault_done || (d.fault.kind != K::kUnlink && d.fault.kind != K::kTruncate) || d.n_completed < d.fault.after) return;
  d.fault_done = true;
  const std::string full = d.root + "/" + *f.path;
  if (d.fault.kind == K::kUnlink) {
    const int r = ::unlink(full.c_str());
    FB_LOG(kWarn) << "storage: fault injection: unlinked " << full << (r == 0 ? "" : std::string(" (failed: ") + std::strerror(errno) + ")");
  } else {
    struct stat st;
    const int r = ::stat(full.c_str(), &st) == 0 ? ::truncate(full.c_str(), st.st_size / 2) : -1;
    FB_LOG(kWarn) << "storage: fault injection: truncated " << full << " to half"
                  << (r == 0 ? "" : std::string(" (failed: ") + std::strerror(errno) + ")");
  }
}

void ReplicaReader::complete(const IoDone& io, uint64_t t) {
  auto it = flights_.find(io.tag);
  FB_CHECK(it != flights_.end()) << "completion for an unknown tag " << io.tag;
  Flight f = std::move(it->second);
  flights_.erase(it);
  Drive& d = drives_[size_t(f.drive)];
  d.queued_bytes -= f.nbytes;
  --d.in_flight;
  ++d.n_completed;
  int64_t res = io.result;
  if (d.inject_after >= 0 && int64_t(d.n_completed) > d.inject_after) res = -d.inject_err;
  apply_fault(d, f);
  if (res >= 0) {
    struct stat st;
    if (fstat(f.fd, &st) == 0) {
      if (st.st_nlink == 0) res = -ENODEV;                                        // the replica vanished mid-read
      else if (int64_t(st.st_size) < d.size_at_open[*f.path]) res = -ESTALE;  // ... or was truncated
    }
  }
  if (opt_.on_complete) opt_.on_complete(f.drive, d.n_completed);
  if (res > 0) {
    // Every landed read measures its drive, also the loser of a hedge: a slow drive's estimate
    // falls even when the other replica serves its chunks.
    const uint64_t from = std::max(f.submit_ns, d.last_done_ns);
    d.last_done_ns = std::max(t, d.last_done_ns);
    d.est.alpha = opt_.ewma_alpha;
    d.est.add(double(res), t > from ? double(t - from) : 0.0);
    if (d.est.valid()) {  // the prior only until the first measurement
      d.rate = d.est.bytes_per_s();
      d.measured = true;
    }
  }
  if (f.job == 0) {  // a straggler: its bytes already landed from another drive
    if (res > 0) ++d.stats.n_late;
    return;
  }
  JobState& j = jobs_.at(f.job);
  Chunk& c = j.chunks[size_t(f.chunk)];
  --c.flights;
  if (c.done) {
    if (res > 0) ++d.stats.n_late;
    return;
  }
  const ReadRange& r = j.ranges[size_t(c.range)];
  if (res < 0) {
    const std::string why = d.root + "/" + r.path + ": " +
                            (res == -ENODEV   ? std::string("file vanished")
                             : res == -ESTALE ? std::string("file truncated mid-run")
                                              : std::string(std::strerror(int(-res))));
    fail_drive(f.drive, why);
    c.errors += "\n  " + why;
    return;  // re-issued on another replica by issue_pending()
  }
  if (uint64_t(res) < c.nbytes) {
    // Short read: end of file (fine when the bytes the range needs are in) or a partial read.
    const uint64_t need_end = r.offset + r.nbytes;
    if (c.file_offset + uint64_t(res) < need_end) {
      if (res == 0) {
        const std::string why = d.root + "/" + r.path + ": shorter than expected (truncated replica?)";
        fail_drive(f.drive, why);
        c.errors += "\n  " + why;
        return;
      }
      d.stats.bytes_read += uint64_t(res);
      c.file_offset += uint64_t(res);
      c.dst += res;
      c.nbytes -= uint32_t(res);
      c.tried = 0;
      c.hedged = false;
      return;
    }
  }
  d.stats.bytes_read += uint64_t(res);
  ++d.stats.n_reads;
  if (f.hedge) ++d.stats.n_hedges_won;
  c.done = true;
  ++j.n_done;
}

Status ReplicaReader::pump(int64_t timeout_us) {
  std::vector<IoDone> done;
  int64_t to = timeout_us;
  if (!held_.empty()) {
    const uint64_t t = now_ns();
    uint64_t first = held_.front().release_ns;
    for (const Held& h : held_) first = std::min(first, h.release_ns);
    const int64_t us = first > t ? int64_t((first - t) / 1000) + 1 : 0;
    to = to < 0 ? us : std::min(to, us);
  }
  if (engine_->in_flight() > 0) {
    FB_RETURN_IF_ERROR(engine_->wait(done, to));
  } else if (!held_.empty() && to > 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(to));
  }
  uint64_t t = now_ns();
  for (const IoDone& io : done) {
    auto it = flights_.find(io.tag);
    FB_CHECK(it != flights_.end()) << "completion for an unknown tag " << io.tag;
    Drive& d = drives_[size_t(it->second.drive)];
    if (d.fault.kind == ReaderFault::Kind::kDelay && d.n_completed >= d.fault.after) {
      // A slow drive: it serves one read per delay_us, in order from each read's submission
      // (not from when we look: a read that landed while nobody waited costs nobody anything).
      const uint64_t release = std::max(it->second.submit_ns, d.delay_free_ns) + uint64_t(d.fault.delay_us) * 1000;
      d.delay_free_ns = release;
      held_.push_back({release, io});
      continue;
    }
    complete(io, t);
  }
  t = now_ns();
  for (size_t i = 0; i < held_.size();) {
    if (held_[i].release_ns <= t) {
      const IoDone io = held_[i].io;
      held_.erase(held_.begin() + std::ptrdiff_t(i));
      complete(io, t);
    } else {
      ++i;
    }
  }
  return Status();
}

Status ReplicaReader::drain(const void* p, size_t n) {
  const auto* a = static_cast<const uint8_t*>(p);
  auto overlaps = [&] {
    for (const auto& [tag, f] : flights_)
      if (f.dst < a + n && a < f.dst + f.nbytes) return true;
    return false;
  };
  while (overlaps()) FB_RETURN_IF_ERROR(pump(-1));
  return Status();
}

Result<ReplicaReader::Job> ReplicaReader::submit(const std::vector<ReadRange>& ranges, int only_drive) {
  FB_CHECK(only_drive < n_drives()) << "drive " << only_drive << " of " << n_drives();
  for (const ReadRange& r : ranges) FB_RETURN_IF_ERROR(drain(r.dst, r.nbytes));
  JobState j;
  j.ranges = ranges;
  j.bounce.assign(ranges.size(), nullptr);
  const uint32_t deny = only_drive >= 0 ? ~(1u << only_drive) : 0u;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const ReadRange& r = ranges[i];
    uint64_t off = r.offset, end = r.offset + r.nbytes;
    uint8_t* dst = r.dst;
    if (!(aligned(r.offset) && aligned(r.nbytes) && aligned(reinterpret_cast<uint64_t>(r.dst)))) {
      off = align_down(r.offset);
      end = align_up(end);
      j.bounce[i] = std::make_shared<AlignedBuffer>(end - off);
      dst = j.bounce[i]->data();
    }
    for (uint64_t o = off; o < end; o += opt_.chunk_bytes) {
      Chunk c;
      c.range = int(i);
      c.deny = deny;
      c.file_offset = o;
      c.nbytes = uint32_t(std::min<uint64_t>(opt_.chunk_bytes, end - o));
      c.dst = dst + (o - off);
      j.chunks.push_back(c);
    }
  }
  const Job id = next_job_++;
  jobs_.emplace(id, std::move(j));
  // Into the kernel now: the reads run while the caller does other work.
  FB_RETURN_IF_ERROR(issue_pending());
  FB_RETURN_IF_ERROR(pump(0));
  return id;
}

bool ReplicaReader::poll(Job job) {
  auto finished = [&] {
    const JobState& j = jobs_.at(job);
    return !j.status.ok() || j.n_done == j.chunks.size();
  };
  if (finished()) return true;
  if (!issue_pending().ok() || !pump(0).ok() || !issue_hedges().ok()) return true;  // wait() reports the error
  return finished();
}

Status ReplicaReader::wait(Job job) {
  FB_CHECK(jobs_.count(job)) << "wait for an unknown read job " << job;
  const uint64_t t0 = now_ns();
  Status st;
  for (;;) {
    st = issue_pending();
    if (!st.ok()) break;
    const JobState& j = jobs_.at(job);
    if (!j.status.ok() || j.n_done == j.chunks.size()) break;
    st = pump(next_event_us());
    if (!st.ok()) break;
    st = issue_hedges();
    if (!st.ok()) break;
  }
  JobState j = std::move(jobs_.at(job));
  jobs_.erase(job);
  // Whatever of this job is still in flight belongs to a finished (or abandoned) chunk: a straggler now.
  for (auto& [tag, f] : flights_)
    if (f.job == job) f.job = 0;
  // A straggler that writes into the CALLER's memory (an aligned range: no bounce buffer keeps its
  // destination alive) must land before we return: the caller may free or reuse that memory, and
  // the kernel would still write into it. Stragglers into bounce buffers may finish later.
  auto caller_owned = [&] {
    for (const auto& [tag, f] : flights_)
      if (f.from_job == job && !f.keep) return true;
    return false;
  };
  while (st.ok() && !opt_.caller_drains && caller_owned()) st = pump(-1);
  wait_ns_ += now_ns() - t0;
  if (!st.ok()) return st;
  if (!j.status.ok()) return j.status;
  for (size_t i = 0; i < j.ranges.size(); ++i)
    if (j.bounce[i])
      std::memcpy(j.ranges[i].dst, j.bounce[i]->data() + (j.ranges[i].offset - align_down(j.ranges[i].offset)), j.ranges[i].nbytes);
  return Status();
}

Status ReplicaReader::read(const std::vector<ReadRange>& ranges, int only_drive) {
  const Job job = FB_TRY(submit(ranges, only_drive));
  return wait(job);
}

}  // namespace fb::storage
