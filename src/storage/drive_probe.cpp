#include "storage/drive_probe.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "storage/aligned_buffer.h"
#include "storage/expert_store.h"
#include "storage/io_engine.h"
#include "storage/record_file.h"

namespace fb::storage {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Keeps `depth` reads of `block` bytes in flight on each of `fds` (files of file_bytes) for
// `seconds`; returns the bytes/s of all of them together.
// record_bytes > 0: the reads walk whole records as the expert reader reads a missed record (its
// block-sized chunks in order, from a record at a random record-aligned offset), each fd's reads
// taking the next chunk of that fd's current record.
// base: the records' first byte (files that hold records after a header); file_bytes counts from it.
Result<double> measure(IoEngine& io, const std::vector<int>& fds, uint64_t file_bytes, uint32_t block, int depth, bool random, double seconds,
                       uint64_t record_bytes = 0, const std::function<void(size_t, uint64_t, uint32_t)>& on_read = {}, uint64_t base = 0) {
  const size_t n_fd = fds.size();
  std::vector<AlignedBuffer> bufs;
  for (size_t i = 0; i < n_fd * size_t(depth); ++i) bufs.emplace_back(block);
  std::mt19937_64 rng(42);
  const uint64_t n_blocks = file_bytes / block;
  uint64_t bytes = 0;
  std::vector<uint64_t> next(n_fd, 0);
  const uint64_t rec_stride = (record_bytes + 4095) / 4096 * 4096;
  const uint64_t n_records = rec_stride ? file_bytes / rec_stride : 0;
  std::vector<uint64_t> rec_start(n_fd, 0), rec_pos(n_fd, record_bytes);
  std::vector<uint32_t> len(n_fd * size_t(depth), block);
  auto offset = [&](size_t f, size_t buf) -> uint64_t {
    if (record_bytes == 0) return (random ? rng() % n_blocks : next[f]++ % n_blocks) * block;
    if (rec_pos[f] >= record_bytes) {
      rec_start[f] = base + (rng() % n_records) * rec_stride;
      rec_pos[f] = 0;
    }
    const uint64_t off = rec_start[f] + rec_pos[f];
    len[buf] = uint32_t((std::min<uint64_t>(block, record_bytes - rec_pos[f]) + 4095) / 4096 * 4096);
    rec_pos[f] += block;
    return off;
  };
  const double t0 = now_s();
  for (size_t i = 0; i < bufs.size(); ++i) {
    const size_t f = i % n_fd;
    const uint64_t off = offset(f, i);
    if (on_read) on_read(f, off, len[i]);
    FB_RETURN_IF_ERROR(io.submit({fds[f], off, len[i], bufs[i].data(), uint64_t(i)}));
  }
  std::vector<IoDone> done;
  bool stop = false;
  while (io.in_flight() > 0 || !done.empty()) {
    done.clear();
    FB_RETURN_IF_ERROR(io.wait(done, -1));
    if (now_s() - t0 > seconds) stop = true;
    for (const IoDone& d : done) {
      if (d.result < 0) return FB_ERROR(kIo) << "probe read: " << std::strerror(int(-d.result));
      bytes += uint64_t(d.result);
      const size_t f = size_t(d.tag) % n_fd;
      if (!stop) {
        const uint64_t off = offset(f, size_t(d.tag));
        if (on_read) on_read(f, off, len[size_t(d.tag)]);
        FB_RETURN_IF_ERROR(io.submit({fds[f], off, len[size_t(d.tag)], bufs[d.tag].data(), d.tag}));
      }
    }
    if (stop && io.in_flight() == 0) break;
  }
  return double(bytes) / (now_s() - t0);
}

// A scratch file of file_bytes in `dir` (written, fsynced, unlinked while open: it goes away with
// the descriptor), opened O_DIRECT when the file system accepts it (*direct says which).
Result<int> open_scratch(const std::string& dir, uint64_t file_bytes, bool* direct) {
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
  *direct = fd >= 0;
  if (fd < 0) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ::unlink(path.c_str());  // the open descriptor keeps it until we are done
  if (fd < 0) return FB_ERROR(kIo) << path << ": " << std::strerror(errno);
  return fd;
}

uint64_t probe_file_bytes(uint64_t file_bytes) { return std::max<uint64_t>(align_up(file_bytes) & ~uint64_t((1 << 20) - 1), 16u << 20); }

}  // namespace

Result<DriveRates> probe_drive(const std::string& dir, uint64_t file_bytes, double seconds_each) {
  DriveRates r;
  r.dir = dir;
  file_bytes = probe_file_bytes(file_bytes);
  r.file_bytes = file_bytes;
  const int fd = FB_TRY(open_scratch(dir, file_bytes, &r.direct));
  auto io = make_io_engine(true, 64);
  r.engine = io->name();
  auto seq = measure(*io, {fd}, file_bytes, 1u << 20, 8, false, seconds_each);
  auto r1m = seq.ok() ? measure(*io, {fd}, file_bytes, 1u << 20, 8, true, seconds_each) : seq;
  auto r4k = r1m.ok() ? measure(*io, {fd}, file_bytes, 4096, 32, true, seconds_each) : r1m;
  ::close(fd);
  if (!r4k.ok()) return r4k.status();
  r.seq_bytes_per_s = *seq;
  r.rand1m_bytes_per_s = *r1m;
  r.rand4k_bytes_per_s = *r4k;
  return r;
}

DriveProbeShape reader_probe_shape(const ReaderOptions& ro, uint64_t record_bytes) {
  DriveProbeShape s;
  s.block = ro.chunk_bytes;
  s.depth_per_dir = ro.queue_depth_per_drive;
  s.record_bytes = record_bytes;
  return s;
}

Result<double> probe_drives_together(const std::vector<std::string>& dirs, uint64_t file_bytes, double seconds, const DriveProbeShape& s) {
  if (s.record_bytes > 0 && s.record_bytes < s.block)
    return FB_ERROR(kInvalidArgument) << "probe records of " << s.record_bytes << " bytes: smaller than one " << s.block << "-byte read";
  return probe_drives_together(dirs, file_bytes, seconds, s.block, s.depth_per_dir, s.record_bytes, s.on_read);
}

Result<double> probe_drives_together(const std::vector<std::string>& dirs, uint64_t file_bytes, double seconds, uint32_t block,
                                     int depth_per_dir, uint64_t record_bytes,
                                     const std::function<void(size_t, uint64_t, uint32_t)>& on_read) {
  if (dirs.empty()) return FB_ERROR(kInvalidArgument) << "no directories to probe";
  if (block == 0 || block % 4096 != 0 || depth_per_dir < 1)
    return FB_ERROR(kInvalidArgument) << "probe reads of " << block << " bytes, " << depth_per_dir << " in flight: need a multiple of 4 KiB and >= 1";
  file_bytes = std::max<uint64_t>(probe_file_bytes(file_bytes), uint64_t(block) * 4);
  const uint64_t rec = (record_bytes + 4095) / 4096 * 4096;
  if (rec > 0) file_bytes = std::max(file_bytes, align_up(rec * 4));
  std::vector<int> fds;
  auto close_all = [&] {
    for (int fd : fds) ::close(fd);
  };
  for (const std::string& d : dirs) {
    bool direct = false;
    auto fd = open_scratch(d, file_bytes, &direct);
    if (!fd.ok()) {
      close_all();
      return fd.status();
    }
    fds.push_back(*fd);
  }
  auto io = make_io_engine(true, unsigned(std::max<size_t>(64, fds.size() * size_t(depth_per_dir))));
  auto rate = measure(*io, fds, file_bytes, block, depth_per_dir, true, seconds, record_bytes, on_read);
  close_all();
  return rate;
}

Result<RecordFiles> record_files_in(const std::vector<std::string>& dirs, uint64_t record_bytes) {
  if (dirs.empty()) return FB_ERROR(kInvalidArgument) << "no replica dirs to read records from";
  RecordFiles f;
  for (const std::string& d : dirs) {
    const std::string store = d + "/" + kStoreFile, flat = d + "/" + kRecordFile;
    uint64_t base = 0, n = 0, rec = 0;
    const bool is_store = ::access(store.c_str(), R_OK) == 0;
    if (is_store) {
      auto s = FB_TRY(ExpertStore::open(d));
      base = s->data_start();
      n = uint64_t(s->n_records());
      rec = s->layout().stride_bytes;
    } else if (::access(flat.c_str(), R_OK) == 0) {
      if (record_bytes == 0) return FB_ERROR(kInvalidArgument) << flat << ": the record size is needed to read it";
      struct stat st;
      if (::stat(flat.c_str(), &st) != 0) return FB_ERROR(kIo) << flat << ": " << std::strerror(errno);
      rec = (record_bytes + 4095) / 4096 * 4096;
      n = uint64_t(st.st_size) / rec;
    } else {
      return FB_ERROR(kNotFound) << d << ": neither " << kStoreFile << " nor " << kRecordFile;
    }
    if (n == 0) return FB_ERROR(kInvalidArgument) << d << ": no whole record of " << rec << " bytes";
    if (!f.paths.empty() && (base != f.base || rec != f.record_bytes))
      return FB_ERROR(kInvalidArgument) << d << ": its records are laid out unlike " << f.paths.front() << "'s";
    f.paths.push_back(is_store ? store : flat);
    f.base = base;
    f.record_bytes = rec;
    f.n_records = f.n_records == 0 ? n : std::min(f.n_records, n);
  }
  return f;
}

Result<double> probe_record_files(const RecordFiles& files, double seconds, const DriveProbeShape& shape) {
  if (files.paths.empty() || files.n_records == 0 || files.record_bytes == 0) return FB_ERROR(kInvalidArgument) << "no records to read";
  if (shape.block == 0 || shape.block % 4096 != 0 || shape.depth_per_dir < 1)
    return FB_ERROR(kInvalidArgument) << "probe reads of " << shape.block << " bytes, " << shape.depth_per_dir << " in flight: need a multiple of 4 KiB and >= 1";
  if (files.base % 4096 != 0) return FB_ERROR(kInvalidArgument) << "records from offset " << files.base << ": not 4 KiB aligned";
  std::vector<int> fds;
  auto close_all = [&] {
    for (int fd : fds) ::close(fd);
  };
  for (const std::string& p : files.paths) {
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd < 0) fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      close_all();
      return FB_ERROR(kIo) << p << ": " << std::strerror(errno);
    }
    fds.push_back(fd);
  }
  // Reads of a record's last chunk round up to 4 KiB: within the record's stride.
  const uint64_t stride = (files.record_bytes + 4095) / 4096 * 4096;
  auto io = make_io_engine(true, unsigned(std::max<size_t>(64, fds.size() * size_t(shape.depth_per_dir))));
  auto rate = measure(*io, fds, files.n_records * stride, shape.block, shape.depth_per_dir, true, seconds, files.record_bytes, shape.on_read,
                      files.base);
  close_all();
  return rate;
}

}  // namespace fb::storage
