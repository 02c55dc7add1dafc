#include "storage/io_engine.h"

#include <linux/io_uring.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>

#include "base/check.h"
#include "base/log.h"

namespace fb::storage {

namespace {

class PreadEngine final : public IoEngine {
 public:
  const char* name() const override { return "pread"; }
  int capacity() const override { return 1 << 20; }
  int in_flight() const override { return int(done_.size()); }
  Status submit(const IoOp& op) override {
    ssize_t r;
    do r = ::pread(op.fd, op.dst, op.nbytes, off_t(op.offset));
    while (r < 0 && errno == EINTR);
    done_.push_back({op.tag, r < 0 ? -int64_t(errno) : int64_t(r)});
    return Status();
  }
  Status wait(std::vector<IoDone>& out, int64_t) override {
    out.insert(out.end(), done_.begin(), done_.end());
    done_.clear();
    return Status();
  }

 private:
  std::deque<IoDone> done_;
};

template <typename T>
T load_acquire(const T* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
template <typename T>
void store_release(T* p, T v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

class UringEngine final : public IoEngine {
 public:
  ~UringEngine() override {
    if (sqes_) munmap(sqes_, sqes_bytes_);
    if (cq_ptr_ && cq_ptr_ != sq_ptr_) munmap(cq_ptr_, cq_bytes_);
    if (sq_ptr_) munmap(sq_ptr_, sq_bytes_);
    if (fd_ >= 0) close(fd_);
  }

  Status init(unsigned entries) {
    io_uring_params p;
    std::memset(&p, 0, sizeof p);
    fd_ = int(syscall(SYS_io_uring_setup, entries, &p));
    if (fd_ < 0) return FB_ERROR(kUnsupported) << "io_uring_setup: " << std::strerror(errno);
    features_ = p.features;
    sq_bytes_ = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    cq_bytes_ = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
    const bool single = p.features & IORING_FEAT_SINGLE_MMAP;
    if (single) sq_bytes_ = cq_bytes_ = std::max(sq_bytes_, cq_bytes_);
    sq_ptr_ = mmap(nullptr, sq_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_, IORING_OFF_SQ_RING);
    if (sq_ptr_ == MAP_FAILED) {
      sq_ptr_ = nullptr;
      return FB_ERROR(kUnsupported) << "io_uring SQ mmap: " << std::strerror(errno);
    }
    if (single) {
      cq_ptr_ = sq_ptr_;
    } else {
      cq_ptr_ = mmap(nullptr, cq_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_, IORING_OFF_CQ_RING);
      if (cq_ptr_ == MAP_FAILED) {
        cq_ptr_ = nullptr;
        return FB_ERROR(kUnsupported) << "io_uring CQ mmap: " << std::strerror(errno);
      }
    }
    sqes_bytes_ = p.sq_entries * sizeof(io_uring_sqe);
    void* s = mmap(nullptr, sqes_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_, IORING_OFF_SQES);
    if (s == MAP_FAILED) return FB_ERROR(kUnsupported) << "io_uring SQE mmap: " << std::strerror(errno);
    sqes_ = static_cast<io_uring_sqe*>(s);
    auto* sq = static_cast<uint8_t*>(sq_ptr_);
    auto* cq = static_cast<uint8_t*>(cq_ptr_);
    sq_head_ = reinterpret_cast<unsigned*>(sq + p.sq_off.head);
    sq_tail_ = reinterpret_cast<unsigned*>(sq + p.sq_off.tail);
    sq_mask_ = *reinterpret_cast<unsigned*>(sq + p.sq_off.ring_mask);
    sq_array_ = reinterpret_cast<unsigned*>(sq + p.sq_off.array);
    cq_head_ = reinterpret_cast<unsigned*>(cq + p.cq_off.head);
    cq_tail_ = reinterpret_cast<unsigned*>(cq + p.cq_off.tail);
    cq_mask_ = *reinterpret_cast<unsigned*>(cq + p.cq_off.ring_mask);
    cqes_ = reinterpret_cast<io_uring_cqe*>(cq + p.cq_off.cqes);
    sq_entries_ = p.sq_entries;
    capacity_ = int(std::min(p.sq_entries, p.cq_entries));
    return Status();
  }

  const char* name() const override { return "io_uring"; }
  int capacity() const override { return capacity_; }
  int in_flight() const override { return in_flight_; }

  Status submit(const IoOp& op) override {
    FB_CHECK_LT(in_flight_, capacity_) << "io_uring over capacity";
    const unsigned tail = *sq_tail_;  // we are the only producer
    FB_CHECK_LT(tail - load_acquire(sq_head_), sq_entries_);
    const unsigned idx = tail & sq_mask_;
    io_uring_sqe* e = &sqes_[idx];
    std::memset(e, 0, sizeof *e);
    e->opcode = IORING_OP_READ;
    e->fd = op.fd;
    e->off = op.offset;
    e->addr = reinterpret_cast<uint64_t>(op.dst);
    e->len = op.nbytes;
    e->user_data = op.tag;
    sq_array_[idx] = idx;
    store_release(sq_tail_, tail + 1);
    ++pending_submit_;
    ++in_flight_;
    return Status();
  }

  Status wait(std::vector<IoDone>& out, int64_t timeout_us) override {
    const size_t before = out.size();
    reap(out);
    const bool want_wait = out.size() == before && timeout_us != 0 && in_flight_ > 0;
    if (pending_submit_ == 0 && !want_wait) return Status();
    unsigned flags = want_wait ? IORING_ENTER_GETEVENTS : 0;
    io_uring_getevents_arg arg;
    __kernel_timespec ts;
    void* argp = nullptr;
    size_t argsz = 0;
    if (want_wait && timeout_us > 0 && (features_ & IORING_FEAT_EXT_ARG)) {
      ts.tv_sec = timeout_us / 1000000;
      ts.tv_nsec = (timeout_us % 1000000) * 1000;
      std::memset(&arg, 0, sizeof arg);
      arg.ts = reinterpret_cast<uint64_t>(&ts);
      flags |= IORING_ENTER_EXT_ARG;
      argp = &arg;
      argsz = sizeof arg;
    }
    // Submit and wait in separate calls: a timed-out wait must not hide how many were submitted.
    while (pending_submit_ > 0) {
      const long r = syscall(SYS_io_uring_enter, fd_, pending_submit_, 0u, 0u, nullptr, 0);
      if (r >= 0) {
        pending_submit_ -= unsigned(r);
        continue;
      }
      if (errno == EINTR || errno == EAGAIN || errno == EBUSY) continue;
      return FB_ERROR(kIo) << "io_uring_enter (submit): " << std::strerror(errno);
    }
    while (want_wait) {
      const long r = syscall(SYS_io_uring_enter, fd_, 0u, 1u, flags, argp, argsz);
      if (r >= 0 || errno == ETIME) break;
      if (errno == EINTR) continue;
      return FB_ERROR(kIo) << "io_uring_enter (wait): " << std::strerror(errno);
    }
    reap(out);
    return Status();
  }

 private:
  void reap(std::vector<IoDone>& out) {
    unsigned head = *cq_head_;
    const unsigned tail = load_acquire(cq_tail_);
    while (head != tail) {
      const io_uring_cqe& c = cqes_[head & cq_mask_];
      out.push_back({c.user_data, int64_t(c.res)});
      ++head;
      --in_flight_;
    }
    store_release(cq_head_, head);
  }

  int fd_ = -1;
  unsigned features_ = 0;
  void *sq_ptr_ = nullptr, *cq_ptr_ = nullptr;
  size_t sq_bytes_ = 0, cq_bytes_ = 0, sqes_bytes_ = 0;
  io_uring_sqe* sqes_ = nullptr;
  io_uring_cqe* cqes_ = nullptr;
  unsigned *sq_head_ = nullptr, *sq_tail_ = nullptr, *sq_array_ = nullptr, *cq_head_ = nullptr, *cq_tail_ = nullptr;
  unsigned sq_mask_ = 0, cq_mask_ = 0, sq_entries_ = 0;
  unsigned pending_submit_ = 0;
  int in_flight_ = 0;
  int capacity_ = 0;
};

}  // namespace

Result<std::unique_ptr<IoEngine>> make_uring_engine(unsigned entries) {
  auto e = std::make_unique<UringEngine>();
  FB_RETURN_IF_ERROR(e->init(entries));
  return std::unique_ptr<IoEngine>(std::move(e));
}

std::unique_ptr<IoEngine> make_pread_engine() { return std::make_unique<PreadEngine>(); }

std::unique_ptr<IoEngine> make_io_engine(bool prefer_uring, unsigned entries) {
  if (prefer_uring) {
    auto e = make_uring_engine(entries);
    if (e.ok()) return std::move(e.value());
    FB_LOG(kInfo) << "storage: " << e.status().message() << "; reading with pread";
  }
  return make_pread_engine();
}

}  // namespace fb::storage
