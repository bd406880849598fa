// y[M, N] = x[M, K] @ W for a few rows (a decode step), with W packed once at load
// (CPU, AVX-512; fp32, or bf16 with fp32 accumulation).
//
// Packed layout. W is cut into column panels of NB = 16 * NR outputs (the last one zero
// padded). A panel is stored K-major, so streaming through it is one sequential read:
//   fp32: [panels, K, NB]          panel p, row k holds W[k, p*NB : (p+1)*NB]
//   bf16: [panels, K2/2, NB, 2]    K2 = K rounded up to even (zero row); pair (k, k+1) of
//                                  each column side by side, the operand order of
//                                  vdpbf16ps (one 512-bit load = 16 columns x 2 k)
//
// Work split. The panels are cut into one contiguous range per thread, so each core
// streams its own part of W from memory (one row is memory-bound). Within a panel the M
// rows are cut into row blocks of at most MR rows (6-12, by panel width); a micro-kernel
// keeps an MR x NR block of 16-float accumulators in registers, so each weight vector
// loaded serves every row of the block. With one block (M <= MR) it runs the whole K in
// registers. With several, all blocks walk the panel together a chunk of 64 steps at a
// time (accumulators parked in a small per-thread buffer between chunks): the chunk is read
// from memory by the first block and from L1 by the others, so 30 rows cost one pass over
// W from memory, not 30. Each chunk prefetches the next one (16 KB ahead in the stream),
// the requests spread over all its row blocks, so memory keeps streaming while the rows
// are computed (30 rows: 19 ms instead of 25 ms for the whole model's matmuls).
// Many rows (a prefill chunk) are taken a row group at a time, each group's x a share of L2.
//
// Arithmetic (the micro-kernels are in dense_tile_avx512.h). fp32: one FMA per multiply-add,
// in k order per output (exact fp32, summed in a different order from MKL). bf16: vdpbf16ps
// adds two exact bf16 x bf16 products to an fp32 accumulator per step, or, where that
// instruction is slow (Intel's cores: half the FMAs' multiply-adds per second), FMAs do the
// same sums on weights widened to fp32 for the rows that are compute bound, and for every
// row on a CPU without AVX512_BF16 (Intel Ice Lake); the sum is rounded to bf16 once, at the
// end (round-to-nearest-even, as torch's bf16 matmul does).
#include <ATen/Parallel.h>
#include "kernel_api.h"

#include <immintrin.h>
#include <omp.h>
#include <unistd.h>

// The kernel's code (this file's, up to its entry point: it is its own object in the kernels
// module) may use AVX-512 and AVX512_BF16 even where -march=native lacks them; the entry
// point, built for the CPU at hand, checks it before calling either path.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

// Outside the target below: their inline functions are one copy in the whole module, which
// must run on any x86-64 CPU (the AVX2 and AMX files include them as well).
#include "dense_prefetch.h"
#include "dense_rows.h"
#include "dense_scratch.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")

#include "bf16_pairs.h"
#include "dense_tile_avx512.h"

namespace {

// Tuning knobs (set_prefetch_bytes, set_prefetch_one_block, set_chunk_steps); the defaults
// were the best measured on Zen 5 (2 cores): with several row blocks (8-30 rows) a prefetch
// distance of 16 KB (4 KB: 1.04-1.47x the time); with one (1-4 rows) 4 KB (16 KB: 1.02-1.07x
// the time); chunks of 64 steps (16 KB of a 64-wide panel, fits L1). The engine core measures
// the one-block distance on its CPU at first start (engine/thread_choice.py).
// Bytes ahead in the weight stream that are prefetched while a chunk is computed (0 = none),
// when the rows need several row blocks, and when they fit in one.
int64_t g_prefetch_bytes = 16384;
int64_t g_prefetch_one_block = 4096;
// Steps per chunk when the rows need several row blocks (see run()).
int64_t g_chunk_steps = 64;
// The AVX2 path even on a CPU with AVX-512 (set_dense_avx2), so that it is tested there too.
bool g_force_avx2 = false;
// bf16 rows from which AMX takes over where the CPU has it (set_dense_amx; 0 = never), and
// its steps per chunk (0: all of K). The tile unit sums each chunk in fp32 in its own order,
// so even in chunks of 64 steps about 1 output in 10^4 rounds to another bf16 than the
// AVX-512 path's (measured on random inputs, as with all of K); each chunk costs a pass of
// fp32 adds over the row blocks' sums. On an Intel Xeon with
// AMX (family 6 model 167 as its VM reports it; 2 threads; all the model's matmuls at 30
// rows), chunks of 64, 128 and 256 steps took 20.1, 18.7 and 18.1 ms, all of K 17.4 ms.
int64_t g_amx_rows = 8;
int64_t g_amx_chunk_steps = 0;
std::atomic<int64_t> g_amx_calls{0};  // products run on AMX so far (dense_amx_calls, tests)

// How the AVX-512 path computes bf16 (set_dense_bf16_fma): by FMAs on weights widened to fp32
// (dense_tile_avx512.h) for rows that need at least this many row blocks, else by vdpbf16ps
// (0: never by FMAs; -1: as chosen for this CPU, dense_bf16_fma_blocks()).
int64_t g_bf16_fma_blocks = -1;
// One row reads this many panels side by side (dense_tile::row_streams), unless
// set_dense_row_streams turns it off (the AVX2 path's own too, of as many panels as its
// registers hold: dense_linear_avx2.cpp). Each thread's weights as four sequential streams
// instead of one, which keep more lines in flight: on an Intel Xeon (family 6 model 167, 2 threads)
// all the model's matmuls at one row took 20.7-21.0 ms in fp32 against 25.4-27.4 one panel
// after another, 12.1-12.7 against 13.4-13.5 in bf16 (MKL's fp32 `x @ W`, which reads eight
// rows of W at once: 20.0-21.0; benchmarks/studies/linear_microbench.py, ours-1stream).
constexpr int kStreams = 4;
bool g_row_streams = true;
// From this many row blocks on, the first block keeps the chunk it widens for the others
// (with fewer, each widening again in registers was faster: measured on an Intel Xeon, family
// 6 model 167, all the model's matmuls at 8 and 12 rows).
constexpr int64_t kStagedBlocks = 3;

using dense_tile::BF16;

// One row of x over a thread's panels [p, p1), kStreams at a time side by side
// (dense_tile::row_streams), while kStreams whole panels are left; returns the first panel
// left over. x, packed and y as run()'s; partial: the thread's kStreams * 16 * NR floats.
template <typename T, int NR>
int64_t one_row_side_by_side(const T* x, const T* packed, int64_t p, int64_t p1,
                             int64_t steps, int64_t N, int64_t chunk, float* partial, T* y) {
  constexpr int64_t NB = 16 * NR;
  constexpr int64_t kStep = 4 * NB / sizeof(T);          // panel elements per step
  constexpr int64_t xStep = sizeof(float) / sizeof(T);  // x elements per step (x as T)
  for (; p + kStreams <= p1; p += kStreams) {
    int64_t valid[kStreams];
    for (int g = 0; g < kStreams; ++g) valid[g] = std::min<int64_t>(NB, N - (p + g) * NB);
    const T* group = packed + p * steps * kStep;
    for (int64_t s0 = 0; s0 < steps; s0 += chunk) {
      const int64_t n = std::min(chunk, steps - s0);
      dense_tile::row_streams<T, NR, kStreams>(x + s0 * xStep, group + s0 * kStep,
                                               steps * kStep, n, partial, s0 > 0,
                                               s0 + n == steps ? y + p * NB : nullptr, valid);
    }
  }
  return p;
}

// Rows of x per row group (set_dense_group_bytes): with more rows than fit in this many bytes
// of x, the rows are taken a group at a time, each group over all of the thread's panels.
// -1: 3/8 of this CPU's L2 per core (768 KB of a 2 MB L2). On an Intel Xeon, family 6 model
// 167, the model's layer matmuls at 512 rows took 269-286 ms with groups of 256 KB to 1 MB of
// x, 297 with 1.5 MB and 310 in one group (benchmarks/studies/linear_microbench.py --rows 512
// --no-lm-head --group-bytes N; docs/performance.md).
int64_t g_group_bytes = -1;

int64_t group_bytes();  // below, outside this file's AVX-512 target

// Where the panel loops below run which tile: T is the packed weight's type; bf16 by FMAs
// from `fma_blocks` row blocks (0: never).
//
// Many rows (a prefill chunk) are taken in row groups of near-equal size whose x fits in
// g_group_bytes: a panel's chunk is read by every row block of the group, whose x and parked
// sums then stay in L2 (the sums of fewer rows in L1) instead of streaming from further out for
// every panel; the weights are read once per group, which many rows can afford. Each row's
// sums are the same whatever its group or block (every output sums the same chunks of k in
// the same order), so the grouping changes the time only, never a result.
template <typename T, int NR>
void run(const T* x, int64_t M, int64_t ldx, int64_t steps, const T* packed, int64_t panels,
         int64_t N, T* y, int nthreads, int64_t fma_blocks) {
  constexpr bool bf16 = std::is_same_v<T, BF16>;
  constexpr int64_t NB = 16 * NR;
  constexpr int64_t kStep = 4 * NB / sizeof(T);   // panel elements per step
  constexpr int64_t xStep = sizeof(float) / sizeof(T);  // x elements per step (x as T)
  constexpr int MRmax = dense_tile::max_rows<NR>();
  static constexpr auto direct = dense_tile::tiles<T, T, T, NR>();
  const auto groups = dense_rows::groups(M, ldx * static_cast<int64_t>(sizeof(T)),
                                         group_bytes(), MRmax);
  const int64_t blocks = groups.blocks;  // the largest group's
  const int64_t prefetch = blocks == 1 ? g_prefetch_one_block : g_prefetch_bytes;
  // bf16 by FMAs: x in fp32, its pairs swapped (bf16_pairs.h). Each row block widens every
  // step in registers; from kStagedBlocks blocks, the first keeps the chunk it widens in a
  // per-thread buffer (in L1), which the others read as fp32 weights.
  const bool fma = bf16 && fma_blocks > 0 && blocks >= fma_blocks;
  const bool staged = fma && blocks >= kStagedBlocks;
  float* xf = fma ? dense_scratch::floats(dense_scratch::kX, M * ldx) : nullptr;
  if (fma) bf16_pairs::to_fp32_swapped(reinterpret_cast<const BF16*>(x), M * ldx / 2, xf);
  // Every row block walks the panel a chunk of steps at a time: the chunk is read from
  // memory once and from L1 by the other blocks, the demand on memory is spread evenly over
  // the compute, and each chunk is summed on its own (see `tile`; sums parked in `partial`).
  const int64_t chunk = std::max<int64_t>(1, g_chunk_steps);
  // One row (and no FMA widening): kStreams panels at a time, read side by side.
  const bool streams = g_row_streams && M == 1 && !fma;
  const int64_t room = (streams ? kStreams : groups.largest) * NB;  // each thread's sums
  float* partial = dense_scratch::floats(dense_scratch::kPartial, nthreads * room);
  const int64_t wide_floats = staged ? 2 * NB * chunk : 0;  // a multiple of 16: aligned
  float* wide = dense_scratch::floats(dense_scratch::kWide, nthreads * wide_floats);
  const char* bytes = reinterpret_cast<const char*>(packed);
  const int64_t total_bytes = panels * steps * kStep * static_cast<int64_t>(sizeof(T));

#pragma omp parallel num_threads(nthreads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t p0 = panels * t / nt, p1 = panels * (t + 1) / nt;
    float* mine = partial + t * room;
    float* buf = wide + t * wide_floats;
    const int64_t first = streams ? one_row_side_by_side<T, NR>(x, packed, p0, p1, steps, N,
                                                                 chunk, mine, y)
                                  : p0;
    for (int64_t g = 0; g < groups.count; ++g) {
      const auto group = dense_rows::group(M, groups.count, g, MRmax);
      for (int64_t p = first; p < p1; ++p) {  // every panel, or those left by the streams
        const T* panel = packed + p * steps * kStep;
        const int64_t valid = std::min<int64_t>(NB, N - p * NB);
        for (int64_t s0 = 0; s0 < steps; s0 += chunk) {
          const int64_t n = std::min(chunk, steps - s0);
          const bool last = s0 + n == steps;
          // The chunk's weights, `prefetch` bytes further on in this thread's stream (its
          // panels are contiguous), are prefetched while it is computed: line l of them by
          // row block l * blocks / lines, so the requests are spread over the whole chunk.
          // (Never past the end of the packed weight.)
          const int64_t offset = ((p * steps + s0) * kStep) * static_cast<int64_t>(sizeof(T));
          const auto ahead =
              dense_prefetch::window(bytes, total_bytes, offset, prefetch, n * NR);
          int64_t row = group.first;
          for (int64_t b = 0; b < group.blocks; ++b) {
            const int64_t rows = group.block_rows(b);
            float* part = mine + (row - group.first) * NB;
            T* out = last ? y + row * N + p * NB : nullptr;
            const char* pf = ahead.part_start(b, group.blocks);
            const int64_t pf_lines = ahead.part_lines(b, group.blocks);
            if (!fma) {
              direct[rows - 1](x + row * ldx + s0 * xStep, ldx, panel + s0 * kStep, n, part,
                               s0 > 0, out, N, valid, pf, pf_lines, nullptr);
            } else if constexpr (bf16) {
              static constexpr auto in_registers = dense_tile::tiles<float, BF16, BF16, NR>();
              static constexpr auto from_buffer = dense_tile::tiles<float, float, BF16, NR>();
              const float* xr = xf + row * ldx + 2 * s0;
              if (!staged || b == 0)  // widens in registers (keeping the chunk when staged)
                in_registers[rows - 1](xr, ldx, panel + s0 * kStep, n, part, s0 > 0, out, N,
                                       valid, pf, pf_lines, staged ? buf : nullptr);
              else
                from_buffer[rows - 1](xr, ldx, buf, 2 * n, part, s0 > 0, out, N, valid, pf,
                                      pf_lines, nullptr);
            }
            row += rows;
          }
        }
      }
    }
  }
}

// The AVX-512 path's entry points, one per weight dtype: NB picks the panel width.
void linear_bf16(const BF16* x, int64_t M, int64_t ldx, const BF16* w, int64_t panels,
                 int64_t NB, int64_t n, BF16* y, int nthreads, int64_t fma_blocks) {
  const int64_t steps = ldx / 2;
  switch (NB) {
    case 16: return run<BF16, 1>(x, M, ldx, steps, w, panels, n, y, nthreads, fma_blocks);
    case 32: return run<BF16, 2>(x, M, ldx, steps, w, panels, n, y, nthreads, fma_blocks);
    case 48: return run<BF16, 3>(x, M, ldx, steps, w, panels, n, y, nthreads, fma_blocks);
    default: return run<BF16, 4>(x, M, ldx, steps, w, panels, n, y, nthreads, fma_blocks);
  }
}

void linear_f32(const float* x, int64_t M, int64_t K, const float* w, int64_t panels,
                int64_t NB, int64_t n, float* y, int nthreads) {
  switch (NB) {
    case 16: return run<float, 1>(x, M, K, K, w, panels, n, y, nthreads, 0);
    case 32: return run<float, 2>(x, M, K, K, w, panels, n, y, nthreads, 0);
    case 48: return run<float, 3>(x, M, K, K, w, panels, n, y, nthreads, 0);
    default: return run<float, 4>(x, M, K, K, w, panels, n, y, nthreads, 0);
  }
}

// Seconds for `iters` rounds of 24 independent vdpbf16ps (Dot) or FMA chains on registers
// only: the instruction's own throughput on this core, with nothing to wait for. (A template,
// so the FMA loop holds no vdpbf16ps: it also runs on AVX-512 CPUs without AVX512_BF16.)
constexpr int kChains = 24;

template <bool Dot>
double register_loop_seconds(int64_t iters) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(1e-3f * i);
  __m512 a = _mm512_set1_ps(1e-7f), b = _mm512_set1_ps(1e-7f);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < kChains; ++i)
      if constexpr (Dot)
        acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)_mm512_castps_si512(a),
                                  (__m512bh)_mm512_castps_si512(b));
      else
        acc[i] = _mm512_fmadd_ps(a, b, acc[i]);
    asm volatile("" : "+v"(a), "+v"(b));  // keeps the loop from being folded
  }
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  __m512 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  volatile float sink = _mm512_reduce_add_ps(sum);
  (void)sink;
  return took.count();
}

// Multiply-adds per second of vdpbf16ps over those of FMAs on one core (about a millisecond).
double bf16_dot_relative_rate() {
  constexpr int64_t kIters = 20000;
  double dot = 1e30, fma = 1e30;
  for (int round = 0; round < 5; ++round) {  // in turns, best of each
    dot = std::min(dot, register_loop_seconds<true>(kIters));
    fma = std::min(fma, register_loop_seconds<false>(kIters));
  }
  return 2.0 * fma / dot;  // vdpbf16ps does two multiply-adds per lane, an FMA one
}

// The FMA register loop, as dense_fma_peak times it: seconds for `iters` rounds.
double fma_loop_seconds(int64_t iters) { return register_loop_seconds<false>(iters); }
constexpr double kFmaFlopPerRound = 2.0 * 16 * kChains;  // 2 FLOP per lane and FMA

// Does this CPU's vdpbf16ps give, bit for bit, the sums of the FMA paths (the k+1 product
// added first, then the k product, each rounded in fp32: Intel's definition)? Random
// normal inputs, 16,384 sums.
bool bf16_dot_is_two_fmas() {
  uint32_t state = 12345;
  auto next = [&state] {  // a small LCG: values near a normal spread, exact in bf16
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(static_cast<int32_t>(state >> 8) - (1 << 23)) / (1 << 22);
  };
  for (int round = 0; round < 1024; ++round) {
    alignas(64) BF16 a[32], b[32];
    alignas(64) float acc[16], out[16];
    for (int i = 0; i < 32; ++i) a[i] = BF16(next()), b[i] = BF16(next());
    for (int i = 0; i < 16; ++i) acc[i] = next() * 4;
    _mm512_store_ps(out, _mm512_dpbf16_ps(_mm512_load_ps(acc), (__m512bh)_mm512_load_si512(a),
                                          (__m512bh)_mm512_load_si512(b)));
    for (int i = 0; i < 16; ++i) {
      volatile float sum = acc[i] + float(a[2 * i + 1]) * float(b[2 * i + 1]);
      if (sum + float(a[2 * i]) * float(b[2 * i]) != out[i]) return false;
    }
  }
  return true;
}

}  // namespace
#pragma GCC pop_options

namespace {
// g_group_bytes, or where it is -1 3/8 of the L2 per core that this CPU reports (384 KB if it
// reports none).
int64_t group_bytes() {
  if (g_group_bytes >= 0) return g_group_bytes;
  static const int64_t from_l2 = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? static_cast<int64_t>(l2) * 3 / 8 : int64_t{384 * 1024};
  }();
  return from_l2;
}
}  // namespace

// The same product on CPUs with AVX2 and FMA only (dense_linear_avx2.cpp); bf16 by FMAs.
namespace dense_avx2 {
void linear_f32(const float* x, int64_t M, int64_t K, const float* packed, int64_t panels,
                int64_t NB, int64_t N, float* y, int nthreads, int64_t chunk_steps,
                int64_t prefetch_one, int64_t prefetch_many, bool row_streams_on,
                int64_t group_bytes);
void linear_bf16(const c10::BFloat16* x, int64_t M, int64_t ldx, const c10::BFloat16* packed,
                 int64_t panels, int64_t NB, int64_t N, c10::BFloat16* y, int nthreads,
                 int64_t chunk_steps, int64_t prefetch_one, int64_t prefetch_many,
                 bool row_streams_on, int64_t group_bytes);
double fma_loop_seconds(int64_t iters);
extern const double kFmaFlopPerRound;
}  // namespace dense_avx2

// Does this CPU have the AVX-512 our code needs (F, BW, VL, DQ), and for the AVX-512 path's
// bf16 also AVX512_BF16?
static bool cpu_has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

// Only where the build's target has it too: a build for a CPU without it (NANO_VLLM_CPU=avx512
// on one with it, model/kernels/build.py) then takes the paths such a CPU takes.
static bool cpu_has_avx512_bf16() {
#ifdef __AVX512BF16__
  return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

// vdpbf16ps's multiply-adds per second over FMAs' on this CPU (0 where it has none),
// measured once.
double bf16_dot_rate() {
  static const double rate = cpu_has_avx512_bf16() ? bf16_dot_relative_rate() : 0.0;
  return rate;
}

bool dense_bf16_dot_is_two_fmas() { return cpu_has_avx512_bf16() && bf16_dot_is_two_fmas(); }

// GFLOP/s of `threads` threads each running `loop` (seconds for `iters` rounds of
// `flop_per_round`) at once: best of 3 rounds of ~10 ms after one to warm up, the slowest
// thread setting each round's time.
static double parallel_rate(double (*loop)(int64_t), int64_t iters, double flop_per_round,
                            int threads) {
  double best = 1e30;
  for (int round = 0; round < 4; ++round) {
    double slowest = 0;
#pragma omp parallel num_threads(threads) reduction(max : slowest)
    slowest = std::max(slowest, loop(iters));
    if (round > 0) best = std::min(best, slowest);
  }
  return threads * flop_per_round * iters / best / 1e9;
}

// The fp32 dense GEMM's instruction peak on this CPU, measured (roofline): GFLOP/s of
// `threads` threads running independent FMA chains on registers only, in the vectors of the
// path the GEMM takes (AVX-512, else AVX2, as set_dense_avx2 may force; 0 without either).
double dense_fma_peak(int64_t threads) {
  TORCH_CHECK(threads > 0, "dense_fma_peak: threads must be positive");
  const int n = static_cast<int>(threads);
  if (cpu_has_avx512() && !g_force_avx2)
    return parallel_rate(&fma_loop_seconds, 1000000, kFmaFlopPerRound, n);
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return parallel_rate(&dense_avx2::fma_loop_seconds, 2000000, dense_avx2::kFmaFlopPerRound,
                         n);
  return 0.0;
}

// vdpbf16ps unless it is slow here: on Intel's cores it does half the multiply-adds per second
// of the two FMA units (measured: 0.50), on AMD Zen 5 as many or more, where it stays (half
// the loads, no widening). Where it is slow, FMAs take the rows that need several row blocks
// (compute bound; with fewer, vdpbf16ps keeps up with memory and was a few percent faster),
// if vdpbf16ps gives the FMAs' very sums, so a row's result still does not depend on its batch;
// else FMAs take every row count.
static constexpr double kDotRateForFma = 0.75;

int64_t dense_bf16_fma_blocks() {
  if (g_bf16_fma_blocks >= 0) return g_bf16_fma_blocks;
  static const int64_t chosen = bf16_dot_rate() >= kDotRateForFma ? 0
                                : dense_bf16_dot_is_two_fmas()   ? kStagedBlocks
                                                                 : 1;
  return chosen;
}

void set_dense_bf16_fma(int64_t blocks) { g_bf16_fma_blocks = std::max<int64_t>(-1, blocks); }

// The bf16 product on CPUs with AMX, for many rows (dense_linear_amx.cpp).
namespace dense_amx {
bool amx_usable();
void linear_bf16(const c10::BFloat16* x, int64_t M, int64_t ldx, const c10::BFloat16* packed,
                 int64_t panels, int64_t NB, int64_t N, c10::BFloat16* y, int nthreads,
                 int64_t chunk, int64_t prefetch);
}  // namespace dense_amx

// x: [..., K] (any float32 or bfloat16 tensor, made contiguous here); packed: the layout
// above, same dtype; n: the true output count; threads: OpenMP threads, 0 = torch's own
// setting (torch.get_num_threads()). Returns y [..., n] in x's dtype.
at::Tensor dense_linear(at::Tensor x, at::Tensor packed, int64_t n, int64_t threads) {
  TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu(), "dense_linear: CPU tensors only");
  TORCH_CHECK(x.dtype() == packed.dtype() &&
                  (x.dtype() == at::kFloat || x.dtype() == at::kBFloat16),
              "dense_linear: x and the packed weight must both be float32 or both bfloat16, got ",
              x.dtype(), " and ", packed.dtype());
  TORCH_CHECK(packed.is_contiguous() &&
                  reinterpret_cast<uintptr_t>(packed.data_ptr()) % 64 == 0,
              "dense_linear: the packed weight must be contiguous and 64-byte aligned");
  const bool bf16 = x.dtype() == at::kBFloat16;
  // AVX-512 where the CPU has it, else AVX2 with FMA. bf16 without AVX512_BF16 (Intel Ice
  // Lake) takes the AVX-512 path's FMAs on widened weights, never vdpbf16ps nor AMX: twice
  // the AVX2 path's vector width.
  const bool avx512 = !g_force_avx2 && cpu_has_avx512();
  const bool bf16_dot = avx512 && cpu_has_avx512_bf16();
  TORCH_CHECK(avx512 || (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")),
              "dense_linear: this CPU has neither AVX-512 nor AVX2 with FMA");
  TORCH_CHECK(x.dim() >= 1 && packed.dim() == (bf16 ? 4 : 3),
              "dense_linear: x [..., K]; packed weight [panels, K, NB] (float32) or "
              "[panels, ceil(K/2), NB, 2] (bfloat16)");
  const int64_t K = x.size(-1), panels = packed.size(0), NB = packed.size(2);
  TORCH_CHECK(K > 0, "dense_linear: x has no input features (K = 0)");
  TORCH_CHECK(NB == 16 || NB == 32 || NB == 48 || NB == 64,
              "dense_linear: panel width must be 16, 32, 48 or 64, got ", NB);
  TORCH_CHECK(n > (panels - 1) * NB && n <= panels * NB,
              "dense_linear: n = ", n, " does not match ", panels, " panels of ", NB);
  if (bf16) {
    TORCH_CHECK(packed.size(3) == 2 && packed.size(1) * 2 == K + (K & 1),
                "dense_linear: bfloat16 packed weight must be [panels, ceil(K/2), NB, 2] for K = ",
                K);
  } else {
    TORCH_CHECK(packed.size(1) == K, "dense_linear: packed weight must be [panels, K, NB] for K = ",
                K);
  }
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end() - 1);
  out_shape.push_back(n);
  auto y = at::empty(out_shape, x.options());
  at::Tensor x2 = x.reshape({-1, K}).contiguous();
  const int64_t M = x2.size(0);
  if (M == 0) return y;
  // An odd K in bf16: pad x with a zero column so k pairs never read past a row.
  at::Tensor xin = (bf16 && (K & 1)) ? at::constant_pad_nd(x2, {0, 1}) : x2;
  const int64_t ldx = xin.size(1);
  const int nthreads = threads > 0 ? static_cast<int>(threads) : at::get_num_threads();
  // AMX for bf16 from g_amx_rows rows, where its tiles fit the shape: K pairs must come in
  // whole B tiles of 16.
  const bool amx = bf16_dot && bf16 && g_amx_rows > 0 && M >= g_amx_rows &&
                   (ldx / 2) % 16 == 0 && dense_amx::amx_usable();
  const int64_t fma_blocks = !bf16 || !avx512 ? 0 : bf16_dot ? dense_bf16_fma_blocks() : 1;

  // Nothing throws from here on (every check done above: nothing may throw inside OpenMP).
  if (!avx512) {
    if (bf16) {
      dense_avx2::linear_bf16(xin.data_ptr<c10::BFloat16>(), M, ldx,
                              packed.data_ptr<c10::BFloat16>(), panels, NB, n,
                              y.data_ptr<c10::BFloat16>(), nthreads,
                              g_chunk_steps, g_prefetch_one_block, g_prefetch_bytes,
                              g_row_streams, group_bytes());
    } else {
      dense_avx2::linear_f32(xin.data_ptr<float>(), M, K, packed.data_ptr<float>(), panels, NB, n,
                             y.data_ptr<float>(), nthreads, g_chunk_steps, g_prefetch_one_block,
                             g_prefetch_bytes, g_row_streams, group_bytes());
    }
    return y;
  }
  if (amx) {
    g_amx_calls.fetch_add(1, std::memory_order_relaxed);
    dense_amx::linear_bf16(xin.data_ptr<c10::BFloat16>(), M, ldx,
                           packed.data_ptr<c10::BFloat16>(), panels, NB, n,
                           y.data_ptr<c10::BFloat16>(), nthreads, g_amx_chunk_steps,
                           g_prefetch_bytes);
  } else if (bf16) {
    linear_bf16(xin.data_ptr<c10::BFloat16>(), M, ldx, packed.data_ptr<c10::BFloat16>(), panels,
                NB, n, y.data_ptr<c10::BFloat16>(), nthreads, fma_blocks);
  } else {
    linear_f32(xin.data_ptr<float>(), M, K, packed.data_ptr<float>(), panels, NB, n,
               y.data_ptr<float>(), nthreads);
  }
  return y;
}

// Bytes ahead in the weight stream prefetched while computing (0 turns prefetch off), for
// rows that need several row blocks.
void set_prefetch_bytes(int64_t bytes) { g_prefetch_bytes = std::max<int64_t>(0, bytes); }

// The same for rows that fit in one row block (a decode step of a few sequences).
void set_prefetch_one_block(int64_t bytes) { g_prefetch_one_block = std::max<int64_t>(0, bytes); }

// Steps (k, or k pairs in bf16) per chunk when several row blocks share a panel.
void set_chunk_steps(int64_t steps) { g_chunk_steps = std::max<int64_t>(1, steps); }

// x bytes per row group for many rows (see run(); 0: all rows in one group; -1: from the L2).
void set_dense_group_bytes(int64_t bytes) { g_group_bytes = std::max<int64_t>(-1, bytes); }

// One row over kStreams panels side by side (the default), or one panel after another.
void set_dense_row_streams(bool on) { g_row_streams = on; }

// Run the AVX2 path even where the AVX-512 one would (both are exact to the same tolerance).
void set_dense_avx2(bool on) { g_force_avx2 = on; }

// bf16 rows from which the AMX path runs where the CPU has AMX (0: never), and its steps per
// chunk (rounded down to whole tiles of 16; 0: all of K).
void set_dense_amx(int64_t rows, int64_t chunk_steps) {
  g_amx_rows = std::max<int64_t>(0, rows);
  g_amx_chunk_steps = chunk_steps <= 0 ? 0 : std::max<int64_t>(16, chunk_steps / 16 * 16);
}

bool dense_amx_usable() { return dense_amx::amx_usable(); }

int64_t dense_amx_calls() { return g_amx_calls.load(std::memory_order_relaxed); }
