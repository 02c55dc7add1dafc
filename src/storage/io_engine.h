// IoEngine: asynchronous positioned reads. UringEngine talks to the kernel's io_uring directly
// (io_uring_setup/enter + mmap of the rings; liburing is not on the GPU machine); PreadEngine is
// the fallback where io_uring is unavailable (old kernel, seccomp): it completes each read inside
// submit(). Completions come back in any order, identified by the op's tag.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"

namespace fb::storage {

struct IoOp {
  int fd = -1;
  uint64_t offset = 0;
  uint32_t nbytes = 0;
  uint8_t* dst = nullptr;
  uint64_t tag = 0;
};

struct IoDone {
  uint64_t tag = 0;
  int64_t result = 0;  // bytes read, or -errno
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  virtual const char* name() const = 0;
  // Ops the engine can hold in flight at once; submit() beyond it is a bug.
  virtual int capacity() const = 0;
  virtual int in_flight() const = 0;
  // Queues a read; it reaches the kernel at the next wait() (batched submission).
  virtual Status submit(const IoOp& op) = 0;
  // Submits what is queued, then waits up to `timeout_us` (-1: no limit, 0: poll) for at least
  // one completion and appends every available one to `out`. Returning with none is a timeout.
  virtual Status wait(std::vector<IoDone>& out, int64_t timeout_us) = 0;
};

// io_uring with `entries` slots, or kUnsupported with the kernel's reason.
Result<std::unique_ptr<IoEngine>> make_uring_engine(unsigned entries);
std::unique_ptr<IoEngine> make_pread_engine();
// io_uring when it works (prefer_uring), pread otherwise.
std::unique_ptr<IoEngine> make_io_engine(bool prefer_uring, unsigned entries = 64);

}  // namespace fb::storage
