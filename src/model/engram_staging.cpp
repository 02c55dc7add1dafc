#include "model/engram_staging.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <system_error>

#include "base/check.h"

namespace fb::model {

EngramStaging::~EngramStaging() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void EngramStaging::join() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [this] { return active_ == 0; });
}

void EngramStaging::worker(int index) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || gen_ != seen; });
    if (stop_) return;
    seen = gen_;
    if (index >= want_) continue;  // not asked for this step
    lock.unlock();
    for (size_t k = 0; k < tables_.size(); ++k) stage(k);
    lock.lock();
    if (--active_ == 0) idle_.notify_all();
  }
}

Status EngramStaging::start(std::vector<Table> layers, const int64_t* ids, int64_t T, int n_tables, int cols, int head_dim, int tasks) {
  join();  // the previous step's workers are done: its buffers may change now
  tables_.clear();
  codes_.clear();
  scales_.clear();
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    error_ = Status();
  }
  if (head_dim % 32 != 0) return FB_ERROR(kInvalidArgument) << "Engram head_dim " << head_dim << " is not a multiple of 32";
  if (T < 0 || T * int64_t(cols) >= (int64_t(1) << 30))
    return FB_ERROR(kInvalidArgument) << "Engram staging: " << T << " rows x " << cols << " columns is out of range";
  for (const Table& t : layers)
    if (t.index < 0 || t.index >= n_tables) return FB_ERROR(kInvalidArgument) << "Engram staging: table " << t.index << " of " << n_tables;
  // The ids first: a bad one is an error of the step, never a read outside a table.
  for (const Table& tab : layers)
    for (int64_t t = 0; t < T; ++t)
      for (int col = 0; col < cols; ++col) {
        const int64_t row = ids[(t * n_tables + tab.index) * cols + col];
        if (row < 0 || row >= tab.rows)
          return FB_ERROR(kInternal) << "Engram row " << row << " outside its table (" << tab.rows << " rows; step row " << t << ", column " << col
                                     << ")";
      }
  tables_ = std::move(layers);
  ids_ = ids;
  T_ = T;
  n_tables_ = n_tables;
  cols_ = cols;
  hd_ = head_dim;
  const size_t n = tables_.size();
  codes_.assign(n, std::vector<uint8_t>(size_t(T * cols * head_dim)));
  scales_.assign(n, std::vector<uint8_t>(size_t(T * cols * (head_dim / 32))));
  claimed_ = std::make_unique<std::atomic<int32_t>[]>(n);
  staged_ = std::make_unique<std::atomic<int32_t>[]>(n);
  for (size_t k = 0; k < n; ++k) {
    claimed_[k].store(0);
    staged_[k].store(0);
  }
  if (n == 0 || T == 0) tasks = 0;
  while (int(workers_.size()) < tasks) {
    try {
      workers_.emplace_back([this, i = int(workers_.size())] { worker(i); });
    } catch (const std::system_error&) {
      break;  // fewer (or no) threads: the layers copy what the workers do not
    }
  }
  {
    // The step's tables, ids and buffers above are published to the workers by this lock.
    std::lock_guard<std::mutex> lock(mu_);
    ++gen_;
    want_ = std::min(tasks, int(workers_.size()));
    active_ = want_;
  }
  wake_.notify_all();
  return Status();
}

void EngramStaging::stage(size_t k) {
  const Table& tab = tables_[k];
  const int64_t hd = hd_, sb = hd_ / 32;
  // A source's reads go out a claim at a time: claims of several step rows (up to ~256 table rows)
  // keep a drive's queue deep in prefill steps; a mapped table is copied a step row at a time.
  const int32_t block = tab.source ? int32_t(std::max(1, 256 / std::max(1, cols_))) : 1;
  std::vector<int64_t> ids;
  for (int64_t t0 = claimed_[k].fetch_add(block); t0 < T_; t0 = claimed_[k].fetch_add(block)) {
    const int64_t n = std::min<int64_t>(block, T_ - t0);
    if (tab.source) {  // the claim's rows in one call: their drive reads in flight together
      ids.clear();
      for (int64_t t = t0; t < t0 + n; ++t) {
        const int64_t* row = &ids_[(t * n_tables_ + tab.index) * cols_];
        ids.insert(ids.end(), row, row + cols_);
      }
      Status st = tab.source->read_rows(tab.layer, ids.data(), int(ids.size()), &codes_[k][size_t(t0 * cols_ * hd)],
                                        &scales_[k][size_t(t0 * cols_ * sb)]);
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(error_mu_);
        if (error_.ok()) error_ = st.with_context("Engram rows of layer " + std::to_string(tab.layer));
      }
    } else {
      const int64_t* row = &ids_[(t0 * n_tables_ + tab.index) * cols_];
      for (int col = 0; col < cols_; ++col) {
        const int64_t i = t0 * cols_ + col;
        std::memcpy(&codes_[k][size_t(i * hd)], tab.codes + row[col] * hd, size_t(hd));
        std::memcpy(&scales_[k][size_t(i * sb)], tab.scales + row[col] * sb, size_t(sb));
      }
    }
    if (staged_[k].fetch_add(int32_t(n), std::memory_order_acq_rel) + n == T_) staged_[k].notify_all();
  }
}

Status EngramStaging::status() const {
  std::lock_guard<std::mutex> lock(error_mu_);
  return error_;
}

EngramStaging::Rows EngramStaging::rows(size_t k, EngramRows* count) {
  FB_CHECK_LT(k, tables_.size());
  const int64_t ahead = staged_[k].load(std::memory_order_acquire);
  const auto t0 = std::chrono::steady_clock::now();
  if (ahead < T_) {
    stage(k);
    for (int32_t d = staged_[k].load(std::memory_order_acquire); d < T_; d = staged_[k].load(std::memory_order_acquire))
      staged_[k].wait(d, std::memory_order_acquire);  // a row a task is copying now
  }
  const double wait_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (count) {
    const uint64_t cols = uint64_t(cols_);
    count->rows += uint64_t(T_) * cols;
    count->bytes += uint64_t(T_) * cols * uint64_t(hd_ + hd_ / 32);
    count->hidden += uint64_t(ahead) * cols;
    count->exposed += uint64_t(T_ - ahead) * cols;
    if (ahead < T_) count->exposed_s += wait_s;
  }
  return Rows{codes_[k].data(), scales_[k].data()};
}

}  // namespace fb::model
