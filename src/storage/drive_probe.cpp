#include "storage/drive_probe.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>

#include "storage/aligned_buffer.h"
#include "storage/io_engine.h"

namespace fb::storage {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Keeps `depth` reads of `block` bytes in flight for `seconds`; returns bytes/s.
Result<double> measure(IoEngine& io, int fd, uint64_t file_bytes, uint32_t block, int depth, bool random, double seconds) {
  std::vector<AlignedBuffer> bufs;
  for (int i = 0; i < depth; ++i) bufs.emplace_back(block);
  std::mt19937_64 rng(42);
  const uint64_t n_blocks = file_bytes / block;
  uint64_t next = 0, bytes = 0;
  auto offset = [&] { return (random ? rng() % n_blocks : next++ % n_blocks) * block; };
  const double t0 = now_s();
  for (int i = 0; i < depth; ++i) FB_RETURN_IF_ERROR(io.submit({fd, offset(), block, bufs[size_t(i)].data(), uint64_t(i)}));
  std::vector<IoDone> done;
  bool stop = false;
  while (io.in_flight() > 0 || !done.empty()) {
    done.clear();
    FB_RETURN_IF_ERROR(io.wait(done, -1));
    if (now_s() - t0 > seconds) stop = true;
    for (const IoDone& d : done) {
      if (d.result < 0) return FB_ERROR(kIo) << "probe read: " << std::strerror(int(-d.result));
      bytes += uint64_t(d.result);
      if (!stop) FB_RETURN_IF_ERROR(io.submit({fd, offset(), block, bufs[d.tag].data(), d.tag}));
    }
    if (stop && io.in_flight() == 0) break;
  }
  return double(bytes) / (now_s() - t0);
}

}  // namespace

Result<DriveRates> probe_drive(const std::string& dir, uint64_t file_bytes, double seconds_each) {
  DriveRates r;
  r.dir = dir;
  file_bytes = std::max<uint64_t>(align_up(file_bytes) & ~uint64_t((1 << 20) - 1), 16u << 20);
  r.file_bytes = file_bytes;
  const std::string path = dir + "/.flashbox-probe." + std::to_string(getpid());
  {
    const int w = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (w < 0) return FB_ERROR(kIo) << path << ": " << std::strerror(errno);
    AlignedBuffer buf(8 << 20);
    std::mt19937_64 rng(7);
    for (size_t i = 0; i < buf.size(); i += 8) {
      const uint64_t v = rng();
      std::memcpy(buf.data() + i, &v, 8);
    }
    for (uint64_t off = 0; off < file_bytes; off += buf.size()) {
      const size_t n = size_t(std::min<uint64_t>(buf.size(), file_bytes - off));
      if (::pwrite(w, buf.data(), n, off_t(off)) != ssize_t(n)) {
        ::close(w);
        ::unlink(path.c_str());
        return FB_ERROR(kIo) << path << ": write failed: " << std::strerror(errno);
      }
    }
    ::fsync(w);
    ::close(w);
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  r.direct = fd >= 0;
  if (fd < 0) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ::unlink(path.c_str());  // the open descriptor keeps it until we are done
  if (fd < 0) return FB_ERROR(kIo) << path << ": " << std::strerror(errno);
  auto io = make_io_engine(true, 64);
  r.engine = io->name();
  Status st;
  auto seq = measure(*io, fd, file_bytes, 1u << 20, 8, false, seconds_each);
  auto r1m = seq.ok() ? measure(*io, fd, file_bytes, 1u << 20, 8, true, seconds_each) : seq;
  auto r4k = r1m.ok() ? measure(*io, fd, file_bytes, 4096, 32, true, seconds_each) : r1m;
  ::close(fd);
  if (!r4k.ok()) return r4k.status();
  r.seq_bytes_per_s = *seq;
  r.rand1m_bytes_per_s = *r1m;
  r.rand4k_bytes_per_s = *r4k;
  return r;
}

}  // namespace fb::storage
