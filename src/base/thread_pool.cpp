#include "base/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace fb {

namespace {

thread_local bool t_in_parallel = false;  // nested parallel_for runs serially

std::atomic<int> g_spin_us{std::thread::hardware_concurrency() > 2 ? 50 : 0};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Spins until done() or the pool's spin time has passed; true if done() held.
template <typename Done>
bool spin_until(Done done) {
  const int us = g_spin_us.load(std::memory_order_relaxed);
  if (us <= 0) return done();
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  for (int i = 0;; ++i) {
    if (done()) return true;
    cpu_relax();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > until) return done();
  }
}

class Pool {
 public:
  explicit Pool(int n) {
    for (int i = 0; i < n - 1; ++i) workers_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_.store(true);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return int(workers_.size()) + 1; }

  void run(int64_t begin, int64_t end, const std::function<void(int64_t)>& fn) {
    std::unique_lock<std::mutex> run_lock(run_mu_);  // one parallel_for at a time per pool
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn_ = &fn;
      next_.store(begin);
      end_ = end;
      pending_.store(int(workers_.size()));
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    work();
    if (!spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; })) {
      std::unique_lock<std::mutex> lk(mu_);
      done_cv_.wait(lk, [this] { return pending_.load(std::memory_order_acquire) == 0; });
    }
    fn_ = nullptr;
  }

 private:
  void work() {
    t_in_parallel = true;
    for (;;) {
      int64_t i = next_.fetch_add(1);
      if (i >= end_) break;
      (*fn_)(i);
    }
    t_in_parallel = false;
  }
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      auto fresh = [&] { return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen; };
      if (!spin_until(fresh)) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, fresh);
      }
      if (stop_.load()) return;
      seen = generation_.load(std::memory_order_acquire);
      work();
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lk(mu_);  // the caller checks pending_ under mu_ before it sleeps
        done_cv_.notify_one();
      }
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  std::atomic<int64_t> next_{0};
  int64_t end_ = 0;
  std::atomic<int> pending_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
};

std::atomic<int> g_threads{0};

Pool& pool() {
  static Pool p(g_threads.load() > 0 ? g_threads.load() : int(std::max(1u, std::thread::hardware_concurrency())));
  return p;
}

}  // namespace

void set_thread_count(int n) { g_threads.store(n); }
int thread_count() { return pool().size(); }
void set_pool_spin_us(int us) { g_spin_us.store(std::max(0, us)); }
int pool_spin_us() { return g_spin_us.load(); }

void parallel_for(int64_t begin, int64_t end, const std::function<void(int64_t)>& fn) {
  if (end <= begin) return;
  if (end - begin == 1 || t_in_parallel || pool().size() == 1) {
    for (int64_t i = begin; i < end; ++i) fn(i);
    return;
  }
  pool().run(begin, end, fn);
}

}  // namespace fb
