// Study: the prefill attention kernel's tasks alone (model/kernels/csrc/paged_prefill_attention_cpu.cpp),
// on one thread, with no Python, no K/V write and no OpenMP around them: one layer's tasks for
// a chunk of `chunk` positions after `cached` cached tokens, the default model's shape (9
// query heads on 3 K/V heads, head dim 64, fp32, blocks of 16 slots in order), split into
// tasks as for 2 threads. Not part of the server; it includes the kernel's own source, so a
// build from each checkout compares two versions of the kernel with nothing else in between.
//
//   g++ -O3 -march=native -ffast-math -fopenmp -std=c++17 $(python3 -c "from torch.utils \
//     import cpp_extension as c; print(' '.join('-I' + p for p in c.include_paths()))") \
//     benchmarks/studies/prefill_attention_task.cpp -o /tmp/prefill_task
//   /tmp/prefill_task [cached chunk]...      (default: 660 30  660 512  0 512)
//
// Prints the best of 200 rounds (each round every task of the layer once) in microseconds,
// and GFLOP/s counting 4 x head dim x heads per (query, visible key) pair.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define PREFILL_TASK_ONLY
#include "../../model/kernels/csrc/paged_prefill_attention_cpu.cpp"

namespace {

constexpr int64_t kHeads = 9, kKvHeads = 3, kDim = 64, kBlockSize = 16, kThreads = 2;
constexpr int kRounds = 200;

void time_layer(int64_t cached, int64_t chunk) {
  const int64_t context = cached + chunk;
  const int64_t blocks = (context + kBlockSize - 1) / kBlockSize;
  std::vector<float> k(blocks * kBlockSize * kKvHeads * kDim), v(k.size());
  std::vector<float> q(chunk * kHeads * kDim), out(q.size());
  std::mt19937 gen(1);
  std::normal_distribution<float> normal;
  for (auto* t : {&k, &v, &q})
    for (float& x : *t) x = normal(gen);
  std::vector<int64_t> table(blocks);
  for (int64_t b = 0; b < blocks; ++b) table[b] = b;

  Shape sh{};
  sh.n = chunk;
  sh.heads = kHeads;
  sh.kv_heads = kKvHeads;
  sh.dim = kDim;
  sh.group = kHeads / kKvHeads;
  sh.block_size = kBlockSize;
  sh.context_len = context;
  const int64_t tiles = count_tiles(chunk, sh.group, kKvHeads, kThreads);
  const float scale = 1.0f / 8.0f;  // head dim 64

  double best = 1e30;
  for (int round = 0; round < kRounds; ++round) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t task = 0; task < tiles * kKvHeads; ++task) {
      const int64_t tile = tiles - 1 - task / kKvHeads, g = task % kKvHeads;
      const int64_t q0 = chunk * tile / tiles, count = chunk * (tile + 1) / tiles - q0;
      prefill_task<float>(sh, q.data(), k.data(), v.data(), table.data(), scale, g, q0, count,
                          out.data());
    }
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count());
  }
  double flop = 0;
  for (int64_t i = 0; i < chunk; ++i) flop += 4.0 * kDim * kHeads * (cached + i + 1);
  std::printf("%4ld cached + %4ld: %9.1f us, %6.1f GFLOP/s (%ld tasks, one thread)\n",
              static_cast<long>(cached), static_cast<long>(chunk), best * 1e6, flop / best / 1e9,
              static_cast<long>(tiles * kKvHeads));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> shapes = {660, 30, 660, 512, 0, 512};
  if (argc > 1) {
    shapes.clear();
    for (int i = 1; i < argc; ++i) shapes.push_back(std::atol(argv[i]));
  }
  if (shapes.size() % 2 != 0 || shapes.empty()) {
    std::fprintf(stderr, "usage: %s [cached chunk]...\n", argv[0]);
    return 2;
  }
  for (size_t i = 0; i < shapes.size(); i += 2) {
    if (shapes[i] < 0 || shapes[i + 1] < 1) {
      std::fprintf(stderr, "cached must be >= 0 and chunk >= 1\n");
      return 2;
    }
    time_layer(shapes[i], shapes[i + 1]);
  }
  return 0;
}
