// Items 0..n-1 of a parallel loop, one contiguous range per thread as a static schedule
// gives, except that a thread done with its own range goes on to claim items from the
// ranges of the threads still at work.
//
// Why: on a small machine the compute threads share their cores with the HTTP process and
// the load generator. Under a static schedule, a thread that is preempted for a moment holds
// its whole share of the loop back while the others spin at the barrier; here they take
// over what it has not started, so a region is late by at most the item it is in.
// Each thread still streams its own contiguous range while no one is preempted (prefetch
// and reads ahead stay in order), and a claim is one atomic add on a cache line of its own.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

class StealingSplit {
 public:
  // Ranges for `threads` threads; a region that gets fewer threads is still complete (the
  // ranges of threads that never came are claimed by the others).
  StealingSplit(int64_t items, int threads) : cursors_(threads > 0 ? threads : 1) {
    const int64_t n = static_cast<int64_t>(cursors_.size());
    for (int64_t t = 0; t < n; ++t) {
      cursors_[t].next.store(items * t / n, std::memory_order_relaxed);
      cursors_[t].end = items * (t + 1) / n;
    }
  }

  // Called by every thread of the region: body(i) for the items it claims, its own range
  // first, then whatever is left of the others'.
  template <class Body>
  void run(int thread, Body&& body) {
    const int64_t n = static_cast<int64_t>(cursors_.size());
    for (int64_t v = 0; v < n; ++v) {
      Cursor& c = cursors_[(thread + v) % n];
      for (int64_t i; (i = c.next.fetch_add(1, std::memory_order_relaxed)) < c.end;) body(i);
    }
  }

 private:
  struct alignas(64) Cursor {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };
  std::vector<Cursor> cursors_;
};
