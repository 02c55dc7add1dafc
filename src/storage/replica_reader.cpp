#include "storage/replica_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>

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
  while (!flights_.empty())
    if (!pump(nullptr, nullptr, -1).ok()) break;
  for (Drive& d : drives_)
    for (auto& [p, fd] : d.fds) ::close(fd);
}

DriveStats ReplicaReader::stats(int drive) const {
  DriveStats s = drives_.at(size_t(drive)).stats;
  s.bytes_per_s = drives_[size_t(drive)].rate;
  return s;
}

void ReplicaReader::set_rate(int drive, double bytes_per_s) { drives_.at(size_t(drive)).rate = bytes_per_s; }

void ReplicaReader::inject_error(int drive, uint64_t after_n, int err) {
  Drive& d = drives_.at(size_t(drive));
  d.inject_after = int64_t(d.n_completed + after_n);
  d.inject_err = err;
}

void ReplicaReader::fail_drive(int drive, const std::string& why) {
  Drive& d = drives_[size_t(drive)];
  ++d.stats.n_errors;
  d.stats.last_error = why;
  if (!d.stats.failed) FB_LOG(kWarn) << "storage: drive " << d.root << " failed (" << why << "); reading from the other replicas";
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
  *direct = dir;
  return fd;
}

int ReplicaReader::pick_drive(const Chunk& c, bool hedge) const {
  int best = -1;
  double best_t = 0;
  bool any_untried = false;
  for (int i = 0; i < n_drives(); ++i) {
    const Drive& d = drives_[size_t(i)];
    if (d.stats.failed || (c.tried & (1u << i))) continue;
    any_untried = true;
    if (d.in_flight >= opt_.queue_depth_per_drive) continue;
    const double t = double(d.queued_bytes + c.nbytes) / std::max(1.0, d.rate);
    if (best < 0 || t < best_t) {
      best = i;
      best_t = t;
    }
  }
  (void)hedge;
  if (best < 0) return any_untried ? -2 : -1;
  return best;
}

Status ReplicaReader::issue(std::vector<Chunk>& chunks, int ci, const std::vector<ReadRange>& ranges, bool hedge) {
  Chunk& c = chunks[size_t(ci)];
  for (;;) {
    const int d = pick_drive(c, hedge);
    if (d < 0) return d == -2 ? Status() : Status(StatusCode::kIo, "no replica left");
    c.tried |= 1u << d;
    bool direct = false;
    auto fd = fd_for(d, ranges[size_t(c.range)].path, &direct);
    if (!fd.ok()) {
      fail_drive(d, fd.status().message());
      c.errors += "\n  " + fd.status().message();
      continue;
    }
    if (engine_->in_flight() >= engine_->capacity()) return Status();
    Drive& dr = drives_[size_t(d)];
    const uint64_t t0 = now_ns();
    const double expect_s = double(dr.queued_bytes + c.nbytes) / std::max(1.0, dr.rate);
    const uint64_t tag = next_tag_++;
    Flight f;
    f.chunk = ci;
    f.drive = d;
    f.fd = *fd;
    f.submit_ns = t0;
    f.nbytes = c.nbytes;
    f.dst = c.dst;
    f.hedge = hedge;
    f.keep = bounce_[size_t(c.range)];
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

Status ReplicaReader::pump(std::vector<Chunk>* chunks, const std::vector<ReadRange>* ranges, int64_t timeout_us) {
  std::vector<IoDone> done;
  FB_RETURN_IF_ERROR(engine_->wait(done, timeout_us));
  const uint64_t t = now_ns();
  for (const IoDone& io : done) {
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
    if (res >= 0) {
      struct stat st;
      if (fstat(f.fd, &st) == 0 && st.st_nlink == 0) res = -ENODEV;  // the replica vanished mid-read
    }
    if (opt_.on_complete) opt_.on_complete(f.drive, d.n_completed);
    if (f.chunk < 0 || !chunks) continue;  // a straggler: its bytes already landed from another drive
    Chunk& c = (*chunks)[size_t(f.chunk)];
    --c.flights;
    if (c.done) continue;
    if (res < 0) {
      const std::string why = d.root + "/" + (*ranges)[size_t(c.range)].path + ": " +
                              (res == -ENODEV ? std::string("file vanished") : std::string(std::strerror(int(-res))));
      fail_drive(f.drive, why);
      c.errors += "\n  " + why;
      continue;  // re-issued by the caller's loop
    }
    if (uint64_t(res) < c.nbytes) {
      // Short read: end of file (fine when the bytes the range needs are in) or a partial read.
      const ReadRange& r = (*ranges)[size_t(c.range)];
      const uint64_t need_end = r.offset + r.nbytes;
      if (c.file_offset + uint64_t(res) < need_end) {
        if (res == 0) {
          const std::string why = d.root + "/" + r.path + ": shorter than expected (truncated replica?)";
          fail_drive(f.drive, why);
          c.errors += "\n  " + why;
          continue;
        }
        c.file_offset += uint64_t(res);
        c.dst += res;
        c.nbytes -= uint32_t(res);
        c.tried = 0;
        continue;
      }
    }
    const uint64_t service = t - std::max(f.submit_ns, d.last_done_ns);
    d.last_done_ns = t;
    if (service > 0) d.rate = (1 - opt_.ewma_alpha) * d.rate + opt_.ewma_alpha * double(f.nbytes) * 1e9 / double(service);
    d.stats.bytes_read += uint64_t(res);
    ++d.stats.n_reads;
    if (f.hedge) ++d.stats.n_hedges_won;
    c.done = true;
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
  while (overlaps()) FB_RETURN_IF_ERROR(pump(nullptr, nullptr, -1));
  return Status();
}

Status ReplicaReader::read(const std::vector<ReadRange>& ranges) {
  for (const ReadRange& r : ranges) FB_RETURN_IF_ERROR(drain(r.dst, r.nbytes));
  // Stragglers from earlier reads may still hold bounce buffers (via Flight::keep).
  bounce_.assign(ranges.size(), nullptr);
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const ReadRange& r = ranges[i];
    uint64_t off = r.offset, end = r.offset + r.nbytes;
    uint8_t* dst = r.dst;
    if (!(aligned(r.offset) && aligned(r.nbytes) && aligned(reinterpret_cast<uint64_t>(r.dst)))) {
      off = align_down(r.offset);
      end = align_up(end);
      bounce_[i] = std::make_shared<AlignedBuffer>(end - off);
      dst = bounce_[i]->data();
    }
    for (uint64_t o = off; o < end; o += opt_.chunk_bytes) {
      Chunk c;
      c.range = int(i);
      c.file_offset = o;
      c.nbytes = uint32_t(std::min<uint64_t>(opt_.chunk_bytes, end - o));
      c.dst = dst + (o - off);
      chunks.push_back(c);
    }
  }
  Status result;
  size_t n_done = 0;
  while (n_done < chunks.size()) {
    // Issue what is not in flight (first tries and retries after a failed drive).
    for (size_t i = 0; i < chunks.size() && result.ok(); ++i) {
      Chunk& c = chunks[i];
      if (c.done || c.flights > 0) continue;
      Status st = issue(chunks, int(i), ranges, false);
      if (!st.ok() || (c.flights == 0 && pick_drive(c, false) == -1)) {
        const ReadRange& r = ranges[size_t(c.range)];
        result = FB_ERROR(kIo) << "reading " << r.path << " [" << c.file_offset << ", +" << c.nbytes << "): no replica left of "
                               << n_drives() << " drive(s):" << (c.errors.empty() ? std::string(" all failed") : c.errors);
      }
    }
    if (!result.ok()) break;
    // Wait for completions, or until the earliest chunk is due for a hedge.
    int64_t timeout_us = -1;
    const uint64_t t = now_ns();
    if (opt_.hedge && n_drives() > 1) {
      for (const Chunk& c : chunks)
        if (!c.done && c.flights > 0 && !c.hedged) {
          const int64_t us = c.deadline_ns > t ? int64_t((c.deadline_ns - t) / 1000) + 1 : 0;
          timeout_us = timeout_us < 0 ? us : std::min(timeout_us, us);
        }
    }
    FB_RETURN_IF_ERROR(pump(&chunks, &ranges, timeout_us));
    if (opt_.hedge && n_drives() > 1) {
      const uint64_t t2 = now_ns();
      for (size_t i = 0; i < chunks.size(); ++i) {
        Chunk& c = chunks[i];
        if (!c.done && c.flights > 0 && !c.hedged && t2 >= c.deadline_ns && pick_drive(c, true) >= 0)
          FB_RETURN_IF_ERROR(issue(chunks, int(i), ranges, true));
      }
    }
    n_done = size_t(std::count_if(chunks.begin(), chunks.end(), [](const Chunk& c) { return c.done; }));
  }
  // Whatever is still in flight belongs to a finished (or abandoned) chunk: a straggler now.
  for (auto& [tag, f] : flights_) f.chunk = -1;
  // A straggler that writes into the CALLER's memory (an aligned range: no bounce buffer keeps its
  // destination alive) must land before we return: the caller may free or reuse that memory, and
  // the kernel would still write into it. Stragglers into bounce buffers may finish later.
  auto caller_owned = [&] {
    for (const auto& [tag, f] : flights_)
      if (!f.keep) return true;
    return false;
  };
  while (caller_owned()) FB_RETURN_IF_ERROR(pump(nullptr, nullptr, -1));
  if (!result.ok()) return result;
  for (size_t i = 0; i < ranges.size(); ++i)
    if (bounce_[i]) std::memcpy(ranges[i].dst, bounce_[i]->data() + (ranges[i].offset - align_down(ranges[i].offset)), ranges[i].nbytes);
  return Status();
}

}  // namespace fb::storage
