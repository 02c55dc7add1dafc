// parallel_for over a fixed pool of worker threads (the CPU executor's only parallelism).
// Work items must be independent; the caller blocks until all are done.
#pragma once

#include <cstdint>
#include <functional>

namespace fb {

// Threads used by parallel_for; 0 = hardware concurrency. Set once in main() from Options.
void set_thread_count(int n);
int thread_count();

// Calls fn(i) for i in [begin, end), split into contiguous chunks over the pool.
void parallel_for(int64_t begin, int64_t end, const std::function<void(int64_t)>& fn);

}  // namespace fb
