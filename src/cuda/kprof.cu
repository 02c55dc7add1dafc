// Per-kernel profiler behind FB_CUDA_LAUNCHED (cuda/device.h). Thread-local, off by default: the
// hook costs one branch per launch. Events are pooled and reused across steps.
#include <vector>

#include "cuda/device.h"

namespace fb::cuda {

namespace {

struct Mark {
  std::string name;
  cudaEvent_t ev;
};

struct KProf {
  bool on = false;
  cudaStream_t st = nullptr;
  const char* op = "-";
  std::vector<cudaEvent_t> pool;
  size_t used = 0;
  std::vector<Mark> marks;
  cudaEvent_t next_event() {
    if (used == pool.size()) {
      cudaEvent_t e = nullptr;
      if (cudaEventCreate(&e) != cudaSuccess) return nullptr;
      pool.push_back(e);
    }
    return pool[used++];
  }
  void record(std::string name) {
    cudaEvent_t e = next_event();
    if (!e || cudaEventRecord(e, st) != cudaSuccess) return;
    marks.push_back({std::move(name), e});
  }
};

thread_local KProf g;

}  // namespace

void kprof_begin(cudaStream_t st) {
  g.on = true;
  g.st = st;
  g.op = "-";
  g.used = 0;
  g.marks.clear();
  g.record("start");
}

void kprof_set_op(const char* op) {
  if (g.on) g.op = op ? op : "-";
}

void kprof_mark(const char* kernel) {
  if (!g.on) return;
  g.record(std::string(g.op) + "/" + kernel);
}

bool kprof_on() { return g.on; }

void kprof_end(void (*add)(void* ctx, const std::string& name, double ms), void* ctx) {
  if (!g.on) return;
  g.on = false;
  cudaStreamSynchronize(g.st);
  for (size_t i = 1; i < g.marks.size(); ++i) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, g.marks[i - 1].ev, g.marks[i].ev) == cudaSuccess) add(ctx, g.marks[i].name, ms);
  }
  g.marks.clear();
  g.used = 0;
}

}  // namespace fb::cuda
