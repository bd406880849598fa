// y[M, N] = x[M, K] @ W on CPUs with AVX2 and FMA but without the AVX-512 that
// dense_linear.cpp needs (AMD Zen 2-3, Intel before Skylake-SP), or without AVX512_BF16 for
// bf16 weights. Same packed layout, work split, chunking and prefetch as dense_linear.cpp
// (read its header first); what differs is the micro-kernel:
//
// - 16 vector registers of 8 floats instead of 32 of 16, so a tile covers a column group of
//   16 outputs of the panel (two registers per row) for up to 6 rows; a 64-wide panel is four
//   groups. The groups of one chunk read disjoint cache lines of it, so with one row block the
//   panel is still read from memory once, and with several the other blocks find the chunk
//   in L1. One row reads several panels side by side (row_streams) where the registers hold
//   their sums: three of 32 columns in fp32, two in bf16, so panels are packed 32 wide for
//   this path (model/dense_linear.py's choose_panel).
// - No bf16 dot-product instruction: a bf16 pair (k, k+1) of a column is one 32-bit word, and
//   its two weights become fp32 exactly by a mask (k+1) and a shift (k); each is then one FMA
//   against x, which is converted to fp32 once per call (exact), k+1 first: the order of
//   the AVX-512 path's FMAs and of Intel's vdpbf16ps (bf16_pairs.h), so that all three give
//   the same sums there. Products of two bf16 values are exact in fp32, so the only rounding
//   is the fp32 sum, as in the fp32 path. With more rows than one block holds, each chunk is
//   widened once into L1 and the fp32 tile runs over it (see run()).
#include <ATen/Parallel.h>
#include "kernel_api.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "dense_prefetch.h"  // outside the target below (dense_linear.cpp says why)
#include "dense_rows.h"
#include "dense_scratch.h"

// This file's code (its own object in the kernels module) may use AVX2 and FMA even where
// -march=native lacks them; dense_linear.cpp checks the CPU before calling it.
#pragma GCC target("avx2,fma")

#include "bf16_pairs.h"

namespace {

constexpr int64_t kGroup = 16;  // outputs per tile: two 8-float registers per row

// The largest row block: MR x 2 accumulators plus the weights and broadcasts of a step must
// fit 16 registers (fp32: 2 weights + 1 broadcast; bf16: 2 converted weights + 2 broadcasts).
template <typename T>
constexpr int max_rows() {
  return std::is_same_v<T, float> ? 6 : 5;
}

// One step (a k in fp32, a k pair in bf16) of an MR x 16 tile. x is fp32 in both cases (in
// bf16, each pair swapped: k+1's value first); w points at the group's 16 columns of this
// step.
template <typename T, int MR>
inline void step(__m256 (&acc)[MR][2], const float* x, int64_t ldx, int64_t s, const T* w) {
  if constexpr (std::is_same_v<T, float>) {
    const __m256 b0 = _mm256_load_ps(w), b1 = _mm256_load_ps(w + 8);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 a = _mm256_broadcast_ss(x + i * ldx + s);
      acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
    }
  } else {
    const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j) {
      // Eight words: column c's pair (W[2s, c], W[2s+1, c]), the k-even weight in the low half.
      const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(w) + j);
      const __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(v, high));
      const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const float* xi = x + i * ldx + 2 * s;
        acc[i][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(xi), odd, acc[i][j]);
        acc[i][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(xi + 1), even, acc[i][j]);
      }
    }
  }
}

// 16 fp32 sums -> 16 bf16, round to nearest even (NaN stays NaN), as torch's conversion.
inline __m256i to_bf16(__m256 lo, __m256 hi) {
  auto round = [](__m256 v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
  };
  // packus interleaves 128-bit lanes (lo0 hi0 lo1 hi1); the permute puts them in order.
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(round(lo), round(hi)), 0xD8);
}

// A tile row's 16 sums of one chunk: added to `partial` when resuming, then kept there, or
// with y given (the last chunk) rounded to Out into y's first `valid_cols` of the 16.
template <typename Out>
inline void finish(__m256 (&acc)[2], float* part, bool resume, Out* y, int64_t valid_cols) {
  if (resume) {
    acc[0] = _mm256_add_ps(acc[0], _mm256_loadu_ps(part));
    acc[1] = _mm256_add_ps(acc[1], _mm256_loadu_ps(part + 8));
  }
  if (y == nullptr) {
    _mm256_storeu_ps(part, acc[0]);
    _mm256_storeu_ps(part + 8, acc[1]);
    return;
  }
  alignas(32) Out row[kGroup];
  if constexpr (std::is_same_v<Out, float>) {
    _mm256_store_ps(row, acc[0]);
    _mm256_store_ps(row + 8, acc[1]);
  } else {
    _mm256_store_si256(reinterpret_cast<__m256i*>(row), to_bf16(acc[0], acc[1]));
  }
  std::memcpy(y, row, sizeof(Out) * std::clamp<int64_t>(valid_cols, 0, kGroup));
}

// MR rows x one 16-column group, over `steps` steps of weights of type W whose rows are
// `ldw` elements apart (x already offset to the same k, w to the group's first column). As in
// dense_linear.cpp's tile: the chunk's sum is added to `partial` ([MR] rows `ldp` floats
// apart) when resuming, and ends in y (rounded to Out, `valid_cols` of the 16 kept) when y is
// given, else in `partial`. pf_lines cache lines from pf on are prefetched, spread over the
// steps.
template <typename W, typename Out, int MR>
void tile(const float* x, int64_t ldx, const W* w, int64_t ldw, int64_t steps, float* partial,
          int64_t ldp, bool resume, Out* y, int64_t ldy, int64_t valid_cols, const char* pf,
          int64_t pf_lines) {
  __m256 acc[MR][2];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  int64_t due = 0;
  for (int64_t s = 0; s < steps; ++s, w += ldw) {
    dense_prefetch::spread(due, pf, pf_lines, steps);
    step<W, MR>(acc, x, ldx, s, w);
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
    finish(acc[i], partial + i * ldp, resume, y == nullptr ? nullptr : y + i * ldy, valid_cols);
}

// One row of x against every group of a panel (G groups of 16 columns): each step's G * 16
// columns are read at once, so the chunk streams in order, where one-group tiles would read it
// G times over at a stride. Each column's FMAs are the tile's, in the same order: the same
// sums. As tile() otherwise (w at the panel's first column of the chunk).
template <typename W, typename Out, int G>
void row_tile(const float* x, const W* w, int64_t ldw, int64_t steps, float* partial,
              bool resume, Out* y, int64_t valid_cols, const char* pf, int64_t pf_lines) {
  constexpr int64_t group_elems = std::is_same_v<W, float> ? kGroup : 2 * kGroup;
  __m256 acc[G][1][2];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) acc[g][0][0] = acc[g][0][1] = _mm256_setzero_ps();
  int64_t due = 0;
  for (int64_t s = 0; s < steps; ++s, w += ldw) {
    dense_prefetch::spread(due, pf, pf_lines, steps);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) step<W, 1>(acc[g], x, 0, s, w + g * group_elems);
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g)
    finish(acc[g][0], partial + g * kGroup, resume, y == nullptr ? nullptr : y + g * kGroup,
           valid_cols - g * kGroup);
}

// One row over S panels of G groups each, side by side: on each panel row_tile's sums (the
// same FMAs in the same order), but S sequential streams from memory in one loop instead of
// one, which keeps more lines in flight through the hardware prefetchers (none requested
// here). S * G * 2 accumulators must leave room in the 16 registers for a step's weights and
// broadcasts (streams_for). `stride`: elements from one panel to the next; partial: [S][NB]
// floats; y: the first panel's outputs; valid[p]: panel p's valid columns.
template <typename W, typename Out, int G, int S>
void row_streams(const float* x, const W* w, int64_t ldw, int64_t stride, int64_t NB,
                 int64_t steps, float* partial, bool resume, Out* y, const int64_t* valid) {
  constexpr int64_t group_elems = std::is_same_v<W, float> ? kGroup : 2 * kGroup;
  __m256 acc[S][G][1][2];
#pragma GCC unroll 4
  for (int p = 0; p < S; ++p)
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) acc[p][g][0][0] = acc[p][g][0][1] = _mm256_setzero_ps();
  for (int64_t s = 0; s < steps; ++s, w += ldw) {
#pragma GCC unroll 4
    for (int p = 0; p < S; ++p)
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) step<W, 1>(acc[p][g], x, 0, s, w + p * stride + g * group_elems);
  }
#pragma GCC unroll 4
  for (int p = 0; p < S; ++p)
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g)
      finish(acc[p][g][0], partial + p * NB + g * kGroup, resume,
             y == nullptr ? nullptr : y + p * NB + g * kGroup, valid[p] - g * kGroup);
}

// `steps` bf16 steps of one 16-column group (rows `ldw` elements apart) widened to fp32 in
// `out`: [2 * steps][16], each pair's k+1 row first (as x's pairs are swapped), the fp32
// tile's input. Exact. Prefetches as tile does.
inline void widen(const c10::BFloat16* w, int64_t ldw, int64_t steps, float* out,
                  const char* pf, int64_t pf_lines) {
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  int64_t due = 0;
  for (int64_t s = 0; s < steps; ++s, w += ldw, out += 2 * kGroup) {
    dense_prefetch::spread(due, pf, pf_lines, steps);
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j) {
      const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(w) + j);
      _mm256_store_ps(out + 8 * j, _mm256_castsi256_ps(_mm256_and_si256(v, high)));
      _mm256_store_ps(out + kGroup + 8 * j, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
  }
}

template <typename W, typename Out>
using TileFn = void (*)(const float*, int64_t, const W*, int64_t, int64_t, float*, int64_t, bool,
                        Out*, int64_t, int64_t, const char*, int64_t);

template <typename W, typename Out, int... Rows>
constexpr auto make_table(std::integer_sequence<int, Rows...>) {
  return std::array<TileFn<W, Out>, sizeof...(Rows)>{&tile<W, Out, Rows + 1>...};
}

template <typename W, typename Out>
using RowTileFn = void (*)(const float*, const W*, int64_t, int64_t, float*, bool, Out*, int64_t,
                           const char*, int64_t);
constexpr int kMaxGroups = 4;  // panels are 16 to 64 columns wide

template <typename T, int... Groups>
constexpr auto make_row_table(std::integer_sequence<int, Groups...>) {
  return std::array<RowTileFn<T, T>, sizeof...(Groups)>{&row_tile<T, T, Groups + 1>...};
}

// Panels one row reads side by side, for panels of G groups: as many as leave room for a
// step's weights and broadcasts beside the accumulators (fp32 12 of the 16 registers, bf16
// 10), at most kMaxStreams; 1 (no streams) for 64 columns, and for 48 in bf16.
constexpr int kMaxStreams = 4;
template <typename W>
constexpr int streams_for(int groups) {
  return std::min(kMaxStreams, (std::is_same_v<W, float> ? 12 : 10) / (2 * groups));
}

template <typename W, typename Out>
using RowStreamsFn = void (*)(const float*, const W*, int64_t, int64_t, int64_t, int64_t, float*,
                              bool, Out*, const int64_t*);

template <typename T, int... Groups>
constexpr auto make_streams_table(std::integer_sequence<int, Groups...>) {
  return std::array<RowStreamsFn<T, T>, sizeof...(Groups)>{
      &row_streams<T, T, Groups + 1, std::max(1, streams_for<T>(Groups + 1))>...};
}

// One row of x over a thread's panels [p, p1), S at a time side by side (row_streams), while
// S whole panels are left; returns the first panel left over. x, packed and y as run()'s;
// partial: the thread's S * NB floats.
template <typename T>
int64_t one_row_side_by_side(const float* x, const T* packed, int64_t p, int64_t p1, int S,
                             int64_t steps, int64_t NB, int64_t N, int64_t chunk, float* partial,
                             T* y) {
  static constexpr auto table =
      make_streams_table<T>(std::make_integer_sequence<int, kMaxGroups>{});
  constexpr int64_t xStep = std::is_same_v<T, float> ? 1 : 2;  // x elements per step
  const int64_t ldw = xStep * NB;                                // panel elements per step
  for (; p + S <= p1; p += S) {
    int64_t valid[kMaxStreams];
    for (int g = 0; g < S; ++g) valid[g] = std::min<int64_t>(NB, N - (p + g) * NB);
    const T* group = packed + p * steps * ldw;
    for (int64_t s0 = 0; s0 < steps; s0 += chunk) {
      const int64_t n = std::min(chunk, steps - s0);
      table[NB / kGroup - 1](x + s0 * xStep, group + s0 * ldw, ldw, steps * ldw, NB, n, partial,
                             s0 > 0, s0 + n == steps ? y + p * NB : nullptr, valid);
    }
  }
  return p;
}

// x: fp32 [M, ldx] (from bf16: each pair swapped); packed: [panels, steps, NB] (fp32) or
// [panels, steps, NB, 2] (bf16).
//
// bf16 with one row block runs the bf16 tile straight from the packed weights (the weights
// are read once either way, and one row is bound by memory). With several, each chunk of a
// column group is first widened to fp32 in a small per-thread buffer (8 KB, in L1), and every
// row block runs the fp32 tile over it: the widening is done once per chunk, not once per
// row block. The sums are the same FMAs in the same order, so a row's result does not depend
// on how many rows came with it.
template <typename T>
void run(const float* x, int64_t M, int64_t ldx, int64_t steps, const T* packed, int64_t panels,
         int64_t NB, int64_t N, T* y, int nthreads, int64_t chunk_steps, int64_t prefetch_one,
         int64_t prefetch_many, bool row_streams_on, int64_t group_bytes) {
  constexpr bool bf16 = !std::is_same_v<T, float>;
  constexpr int MRdirect = max_rows<T>(), MRwide = max_rows<float>();
  static constexpr auto direct = make_table<T, T>(std::make_integer_sequence<int, MRdirect>{});
  static constexpr auto wide = make_table<float, T>(std::make_integer_sequence<int, MRwide>{});
  static constexpr auto one_row = make_row_table<T>(std::make_integer_sequence<int, kMaxGroups>{});
  constexpr int64_t xStep = bf16 ? 2 : 1;  // x elements per step
  const int64_t ldw = bf16 ? 2 * NB : NB;  // panel elements per step
  const int64_t groups = NB / kGroup;
  // Several row blocks of bf16 go through the widened chunk, so they block as fp32 does.
  const bool widened = bf16 && M > MRdirect;
  const int MRmax = widened || !bf16 ? MRwide : MRdirect;
  // Row groups whose x fits in group_bytes (dense_rows.h, as dense_linear.cpp's run()).
  const auto row_groups = dense_rows::groups(M, ldx * static_cast<int64_t>(sizeof(float)),
                                             group_bytes, MRmax);
  const int64_t blocks = row_groups.blocks;  // the largest group's
  const int64_t prefetch = blocks == 1 ? prefetch_one : prefetch_many;
  const int64_t chunk = std::max<int64_t>(1, chunk_steps);
  // One row (and panels narrow enough): S panels at a time, read side by side.
  const int S = M == 1 && row_streams_on ? streams_for<T>(static_cast<int>(groups)) : 1;
  const int64_t room = std::max<int64_t>(row_groups.largest, S) * NB;  // each thread's sums
  float* partial = dense_scratch::floats(dense_scratch::kPartial, nthreads * room);
  const int64_t wide_floats = widened ? 2 * kGroup * chunk : 0;  // a multiple of 8: aligned
  float* wide_buf = dense_scratch::floats(dense_scratch::kWide, nthreads * wide_floats);
  const char* bytes = reinterpret_cast<const char*>(packed);
  const int64_t total_bytes = panels * steps * ldw * static_cast<int64_t>(sizeof(T));

#pragma omp parallel num_threads(nthreads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t p0 = panels * t / nt, p1 = panels * (t + 1) / nt;
    float* mine = partial + t * room;
    float* buf = wide_buf + t * wide_floats;
    const int64_t first = S > 1 ? one_row_side_by_side(x, packed, p0, p1, S, steps, NB, N, chunk,
                                                       mine, y)
                                : p0;
    for (int64_t rg = 0; rg < row_groups.count; ++rg) {
      const auto group = dense_rows::group(M, row_groups.count, rg, MRmax);
      // Where a chunk's prefetches go: spread over its tiles, or over its widenings.
      const int64_t calls = widened ? groups : group.blocks * groups;
      for (int64_t p = first; p < p1; ++p) {  // every panel, or those left by the streams
        const T* panel = packed + p * steps * ldw;
        const int64_t valid = std::min<int64_t>(NB, N - p * NB);
        for (int64_t s0 = 0; s0 < steps; s0 += chunk) {
          const int64_t n = std::min(chunk, steps - s0);
          const bool last = s0 + n == steps;
          const int64_t offset = (p * steps + s0) * ldw * static_cast<int64_t>(sizeof(T));
          const int64_t chunk_lines = n * ldw * static_cast<int64_t>(sizeof(T)) / 64;
          const auto ahead = dense_prefetch::window(bytes, total_bytes, offset, prefetch,
                                                    chunk_lines);
          if (M == 1) {  // one row: the whole panel's steps in order
            one_row[groups - 1](x + s0 * xStep, panel + s0 * ldw, ldw, n, mine, s0 > 0,
                                last ? y + p * NB : nullptr, valid, ahead.start, ahead.lines);
            continue;
          }
          int64_t call = 0;
          for (int64_t g = 0; g < groups; ++g) {
            const int64_t col = g * kGroup;
            const T* w = panel + s0 * ldw + (bf16 ? 2 * col : col);  // the group's first element
            if constexpr (bf16) {
              if (widened) {
                widen(w, ldw, n, buf, ahead.part_start(g, calls), ahead.part_lines(g, calls));
              }
            }
            int64_t row = group.first;
            for (int64_t b = 0; b < group.blocks; ++b) {
              const int64_t rows = group.block_rows(b);
              const float* xr = x + row * ldx + s0 * xStep;
              float* part = mine + (row - group.first) * NB + col;
              T* out = last ? y + row * N + p * NB + col : nullptr;
              if (widened) {
                wide[rows - 1](xr, ldx, buf, kGroup, n * 2, part, NB, s0 > 0, out, N,
                               valid - col, nullptr, 0);
              } else {
                direct[rows - 1](xr, ldx, w, ldw, n, part, NB, s0 > 0, out, N, valid - col,
                                 ahead.part_start(call, calls), ahead.part_lines(call, calls));
                ++call;
              }
              row += rows;
            }
          }
        }
      }
    }
  }
}

}  // namespace

namespace dense_avx2 {

// Seconds for `iters` rounds of 12 independent FMA chains on registers only (the AVX2
// twin of dense_linear.cpp's register loop: 16 ymm registers hold 12 chains and the inputs).
constexpr int kChains = 12;
extern const double kFmaFlopPerRound = 2.0 * 8 * kChains;  // 2 FLOP per lane and FMA

double fma_loop_seconds(int64_t iters) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(1e-3f * i);
  __m256 a = _mm256_set1_ps(1e-7f), b = _mm256_set1_ps(1e-7f);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(a, b, acc[i]);
    asm volatile("" : "+x"(a), "+x"(b));  // keeps the loop from being folded
  }
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  __m256 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm256_add_ps(sum, acc[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  volatile float sink = lanes[0];
  (void)sink;
  return took.count();
}

void linear_f32(const float* x, int64_t M, int64_t K, const float* packed, int64_t panels,
                int64_t NB, int64_t N, float* y, int nthreads, int64_t chunk_steps,
                int64_t prefetch_one, int64_t prefetch_many, bool row_streams_on,
                int64_t group_bytes) {
  run<float>(x, M, K, K, packed, panels, NB, N, y, nthreads, chunk_steps, prefetch_one,
             prefetch_many, row_streams_on, group_bytes);
}

// x in bf16, converted here (each pair swapped).
void linear_bf16(const c10::BFloat16* x, int64_t M, int64_t ldx, const c10::BFloat16* packed,
                 int64_t panels, int64_t NB, int64_t N, c10::BFloat16* y, int nthreads,
                 int64_t chunk_steps, int64_t prefetch_one, int64_t prefetch_many,
                 bool row_streams_on, int64_t group_bytes) {
  float* xf = dense_scratch::floats(dense_scratch::kX, M * ldx);
  bf16_pairs::to_fp32_swapped(x, M * ldx / 2, xf);
  run<c10::BFloat16>(xf, M, ldx, ldx / 2, packed, panels, NB, N, y, nthreads,
                     chunk_steps, prefetch_one, prefetch_many, row_streams_on, group_bytes);
}

}  // namespace dense_avx2
