// Errors raised inside an OpenMP parallel region. An exception may not leave a region's
// block: if one does, std::terminate ends the process, and every request with it. A region
// whose body can throw (it allocates, say) runs each iteration under capture(), which keeps
// the first error and lets the other iterations finish; after the region, rethrow() raises it
// as a c10::Error. That reaches Python as a RuntimeError, and the engine fails the requests of
// that step only (engine/core.py) and goes on serving the others.
//
// capture() must wrap whole iterations of a `parallel for` (or a region with no barrier in
// it): a thread that skipped a barrier would leave the others waiting for it.
#pragma once

#include <c10/util/Exception.h>

#include <atomic>
#include <exception>
#include <mutex>
#include <string>

class ParallelErrors {
 public:
  template <typename Body>
  void capture(Body&& body) noexcept {
    try {
      body();
    } catch (const std::exception& e) {
      keep(e.what());
    } catch (...) {
      keep("an unknown exception");
    }
  }

  // Raise the first error captured, if any, naming the kernel.
  void rethrow(const char* kernel) const {
    TORCH_CHECK(!failed_.load(std::memory_order_acquire), kernel,
                ": failed inside its parallel region: ", message_);
  }

 private:
  void keep(const char* what) noexcept {
    std::lock_guard<std::mutex> hold(mutex_);
    if (failed_.load(std::memory_order_relaxed)) return;
    try {
      message_ = what;
    } catch (...) {  // no memory for the message: the failure is still raised
    }
    failed_.store(true, std::memory_order_release);
  }

  std::atomic<bool> failed_{false};
  std::mutex mutex_;
  std::string message_;
};
