// A check of stealing_split.h from Python: who ran each item when one thread comes late.
#include <torch/extension.h>

#include <omp.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "stealing_split.h"

// Items 0..items-1 split over `threads` OpenMP threads; thread `late` starts `late_us`
// microseconds after the others, and each item takes about `item_us`. Returns, per item, the
// thread that ran it, or -1 if none did, or -2 if more than one did.
torch::Tensor stealing_split_owners(int64_t items, int64_t threads, int64_t late,
                                    int64_t late_us, int64_t item_us) {
  TORCH_CHECK(items >= 0 && threads >= 1, "stealing_split_owners: items >= 0, threads >= 1");
  std::vector<std::atomic<int64_t>> runs(static_cast<size_t>(items));
  auto owners = torch::full({items}, -1, torch::kInt64);
  int64_t* owner = owners.data_ptr<int64_t>();
  StealingSplit split(items, static_cast<int>(threads));
  pybind11::gil_scoped_release no_gil;
#pragma omp parallel num_threads(static_cast<int>(threads))
  {
    const int me = omp_get_thread_num();
    if (me == late) std::this_thread::sleep_for(std::chrono::microseconds(late_us));
    split.run(me, [&](int64_t i) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(item_us);
      while (std::chrono::steady_clock::now() < until) {
      }
      owner[i] = me;
      runs[i].fetch_add(1);
    });
  }
  for (int64_t i = 0; i < items; ++i)
    if (runs[i].load() != 1) owner[i] = runs[i].load() == 0 ? -1 : -2;
  return owners;
}
