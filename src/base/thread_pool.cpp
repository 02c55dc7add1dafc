#include "base/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace fb {

namespace {

thread_local bool t_in_parallel = false;  // nested parallel_for runs serially

class Pool {
 public:
  explicit Pool(int n) {
    for (int i = 0; i < n - 1; ++i) workers_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
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
      next_ = begin;
      end_ = end;
      pending_ = int(workers_.size());
      ++generation_;
    }
    cv_.notify_all();
    work();
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [this] { return pending_ == 0; });
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
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      work();
      {
        std::lock_guard<std::mutex> lk(mu_);
        --pending_;
      }
      done_cv_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  std::atomic<int64_t> next_{0};
  int64_t end_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

std::atomic<int> g_threads{0};

Pool& pool() {
  static Pool p(g_threads.load() > 0 ? g_threads.load() : int(std::max(1u, std::thread::hardware_concurrency())));
  return p;
}

}  // namespace

void set_thread_count(int n) { g_threads.store(n); }
int thread_count() { return pool().size(); }

void parallel_for(int64_t begin, int64_t end, const std::function<void(int64_t)>& fn) {
  if (end <= begin) return;
  if (end - begin == 1 || t_in_parallel || pool().size() == 1) {
    for (int64_t i = begin; i < end; ++i) fn(i);
    return;
  }
  pool().run(begin, end, fn);
}

}  // namespace fb
