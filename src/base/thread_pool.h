// parallel_for over a fixed pool of worker threads (the CPU executor's only parallelism).
// Work items must be independent; the caller blocks until all are done.
#pragma once

#include <cstdint>
#include <functional>

namespace fb {

// Threads used by parallel_for; 0 = hardware concurrency. Set once in main() from Options.
void set_thread_count(int n);
int thread_count();

// How long an idle worker (and a caller waiting for the workers) spins before it sleeps on the
// pool's condition variable, in microseconds: back-to-back parallel_for calls then find the
// workers awake instead of paying a wake-up each (on a VM tens of microseconds a thread).
// Default 50 with more than two hardware threads, else 0 (a spinning thread would take the core
// from the one that has work).
void set_pool_spin_us(int us);
int pool_spin_us();

// Calls fn(i) for i in [begin, end), split into contiguous chunks over the pool.
void parallel_for(int64_t begin, int64_t end, const std::function<void(int64_t)>& fn);

}  // namespace fb
