// Private to the CUDA executor (included by layer_ops.h): the per-step device arena.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/device.h"
#include "cuda/executor.h"

namespace fb::cuda {

// `bytes` from page-locked host memory (device-addressable: cudaMallocHost under unified
// addressing) into device memory by a kernel on `st` that reads the host bytes over PCIe, so the
// copy does not queue behind other streams' transfers on the copy engines (a cold prefill's expert
// prefetch keeps them busy for tens of milliseconds). The same bytes as cudaMemcpyAsync.
// Defined in device.cu.
Status copy_from_pinned(void* dst, const void* pinned_src, size_t bytes, cudaStream_t st);

// Per-step device allocations: bump-allocated from the executor's StepWorkspace (no cudaMalloc
// once warmed up; uploads staged through its pinned buffer), with plain cudaMalloc as the
// fallback when it is too small or already in use. The destructor synchronises the stream (the
// step is over, so the next step may reuse the memory) and grows the workspace to this step's
// high-water mark.
class Arena {
 public:
  Arena(cudaStream_t st, StepWorkspace* ws) : st_(st), ws_(ws && !ws->busy ? ws : nullptr) {
    if (ws_) ws_->busy = true;
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() {
    if (!ws_) return;
    if (ws_->capturing) {  // nothing may wait inside a capture; the workspace was warmed up
      ws_->busy = false;
      return;
    }
    cudaStreamSynchronize(st_);
    ws_->dev_high = std::max(ws_->dev_high, dev_peak_);
    ws_->pin_high = std::max(ws_->pin_high, pin_need_);
    if (ws_->dev_high > ws_->dev.bytes()) {
      // This step's fallback buffers go first (the stream is drained): the grown workspace
      // replaces them, and holding both could need 2.25x the step. Then 1.25x the mark, else the
      // mark itself; a failure is cleared (cudaMalloc's error would otherwise be reported by the
      // next kernel launch: issue 26's "embed_rows_kernel: out of memory") and later steps of
      // this size allocate per op.
      bufs_.clear();
      ws_->dev.reset();
      bool grown = ws_->dev.alloc(ws_->dev_high + ws_->dev_high / 4).ok();
      if (!grown) {
        cudaGetLastError();
        grown = ws_->dev.alloc(ws_->dev_high).ok();
      }
      if (!grown) {
        ws_->dev.reset();
        cudaGetLastError();
      }
    }
    grow_pinned(ws_->pin_high);
    ws_->busy = false;
  }
  template <typename T>
  T* alloc(int64_t n, Status& status) {
    if (!status.ok()) return nullptr;
    const size_t bytes = round_up(size_t(std::max<int64_t>(n, 1)) * sizeof(T));
    if (ws_) {
      const size_t off = dev_need_;
      dev_need_ += bytes;
      dev_peak_ = std::max(dev_peak_, dev_need_);
      if (dev_need_ <= ws_->dev.bytes()) return reinterpret_cast<T*>(ws_->dev.get<uint8_t>() + off);
    }
    DeviceBuffer b;
    status = b.alloc(bytes);
    if (!status.ok()) return nullptr;
    T* p = b.get<T>();
    bufs_.push_back(std::move(b));
    return p;
  }
  template <typename T>
  T* upload(const std::vector<T>& v, Status& status) {
    T* p = alloc<T>(int64_t(v.size()), status);
    if (!p || v.empty()) return status.ok() ? p : nullptr;
    const size_t bytes = v.size() * sizeof(T);
    const void* src = v.data();
    bool staged = false;
    if (ws_) {
      const size_t off = pin_need_;
      pin_need_ += round_up(bytes);
      if (pin_need_ <= ws_->pin_cap) {
        void* stage = static_cast<uint8_t*>(ws_->pinned) + off;
        std::memcpy(stage, v.data(), bytes);
        src = stage;
        staged = true;
      }
    }
    if (staged && ws_->sm_uploads && !ws_->capturing) status = copy_from_pinned(p, src, bytes, st_);
    else status = cuda_status(cudaMemcpyAsync(p, src, bytes, cudaMemcpyHostToDevice, st_), "upload");
    kprof_mark("upload");
    return status.ok() ? p : nullptr;
  }

  // The caller has synchronised the stream: every staged upload's copy has finished, so the
  // page-locked staging is used again from its start (CudaRunOptions::reuse_staging), and grown
  // now if the uploads since the last drain overflowed it. A prefill chunk uploads tens of MB of
  // key tables a layer; staged per step they overflow any sane staging buffer, and the overflow
  // goes out as pageable copies, which block the host until the copy engine reaches them, i.e.
  // behind every expert copy the prefetch has queued. Between two routing syncs a step uploads
  // one layer's tables.
  void drained() {
    if (!ws_ || ws_->capturing || !ws_->reuse_staging) return;
    const size_t need = pin_need_;
    pin_need_ = 0;
    grow_pinned(need);
  }

  // Frames: device memory allocated after mark() is reused by allocations after release(m).
  // Safe because every kernel of a step runs on one stream in issue order. Pinned staging is
  // never released (an upload's host copy may still be waiting for its transfer). Fallback
  // buffers (the workspace was too small: a first step of a new size) made inside the frame are
  // freed after the stream drains, so that step peaks at one op's temporaries too.
  struct Mark {
    size_t dev, bufs;
  };
  Mark mark() const { return {dev_need_, bufs_.size()}; }
  void release(const Mark& m) {
    dev_need_ = std::min(dev_need_, m.dev);
    if (bufs_.size() > m.bufs && !(ws_ && ws_->capturing)) {
      cudaStreamSynchronize(st_);
      bufs_.resize(m.bufs);
    }
  }

 private:
  static size_t round_up(size_t b) { return (b + 255) & ~size_t(255); }
  // Grows the page-locked staging to 1.25x `need` (a need above kPinMax grows nothing; a failure
  // leaves none: uploads then go out pageable). Only with no staged copy still pending.
  void grow_pinned(size_t need) {
    constexpr size_t kPinMax = size_t(256) << 20;
    if (need <= ws_->pin_cap || need > kPinMax) return;
    if (ws_->pinned) cudaFreeHost(ws_->pinned);
    ws_->pinned = nullptr;
    ws_->pin_cap = 0;
    const size_t want = std::max<size_t>(need + need / 4, size_t(1) << 20);
    if (cudaMallocHost(&ws_->pinned, want) == cudaSuccess) ws_->pin_cap = want;
    else ws_->pinned = nullptr, cudaGetLastError();
  }
  cudaStream_t st_;
  StepWorkspace* ws_;
  size_t dev_need_ = 0, pin_need_ = 0, dev_peak_ = 0;
  std::vector<DeviceBuffer> bufs_;
};

}  // namespace fb::cuda
