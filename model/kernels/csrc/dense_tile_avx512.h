// The AVX-512 micro-kernels of the dense GEMM (dense_linear.cpp, read its header first): one
// MR x NB block of outputs over a run of steps of one packed panel, with its accumulators in
// registers. Included by dense_linear.cpp only, inside its AVX-512 target region.
//
// Three ways to compute a step, by the types the tile reads (x, w):
//   (float, float)        fp32: one FMA per multiply-add;
//   (BFloat16, BFloat16)  bf16 by vdpbf16ps: a k pair of each column per instruction;
//   (float, BFloat16)     bf16 by FMAs: each pair's two weights widened to fp32 in registers
//                         (a mask and a shift), then one FMA each, k+1 first, against x in
//                         fp32 with each pair's two values swapped (bf16_pairs.h).
// Products of two bf16 values are exact in fp32. Intel defines vdpbf16ps as the k+1 product
// added to the accumulator, then the k product, each rounded in fp32: so the FMA order above
// gives the instruction's own sums (where a CPU does as Intel defines: checked by
// bf16_dot_is_two_fmas()), and a CPU whose vdpbf16ps has half the FMA units' throughput
// (Intel's cores, measured) gets fp32's compute rate in bf16 with the same results.
// The FMA way and the rounding of the outputs to bf16 use AVX-512 F/BW only, so a CPU without
// AVX512_BF16 (Intel Ice Lake) computes bf16 that way, in 16-float vectors.
#pragma once

#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "dense_prefetch.h"

namespace dense_tile {
namespace {

using BF16 = c10::BFloat16;

inline __mmask16 tail_mask(int64_t valid) {
  return valid >= 16 ? static_cast<__mmask16>(0xFFFF)
                     : static_cast<__mmask16>((1u << std::max<int64_t>(valid, 0)) - 1u);
}

// 16 fp32 sums -> 16 bf16, rounded to nearest even by integer arithmetic (NaN stays NaN), as
// torch's conversion and the AVX2 path round: vcvtneps2bf16 would need AVX512_BF16 (and
// flushes denormal sums to zero).
inline __m256i to_bf16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7FC0)));
}

inline __m512i broadcast_pair(const BF16* p) {
  int32_t bits;
  std::memcpy(&bits, p, sizeof(bits));
  return _mm512_set1_epi32(bits);
}

// A panel row of pairs as two fp32 vectors of 16 columns: the k+1 weights (the high halves,
// masked) and the k weights (the low halves, shifted up).
inline void widen_pairs(__m512i v, __m512& odd, __m512& even) {
  odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

// Column groups whose widened weights the FMA step holds at once (see step()).
constexpr int fma_groups(int MR, int NR) {
  for (int g = NR; g > 1; --g)
    if (NR % g == 0 && MR * NR + 2 * g + 3 <= 32) return g;
  return 1;
}

// One step: a k (w fp32) or a k pair (w bf16) for MR rows x 16 * NR columns.
// With `keep` (FMA step only), the step's widened weights are also stored there for the
// row blocks after this one: [2 * s][NB] is the k+1 row, [2 * s + 1][NB] the k row.
template <typename X, typename W, int MR, int NR>
inline void step(__m512 (&acc)[MR][NR], const X* x, int64_t ldx, int64_t s, const W* w,
                 float* keep) {
  if constexpr (std::is_same_v<W, float>) {
    static_assert(std::is_same_v<X, float>);
    __m512 b[NR];
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) b[j] = _mm512_load_ps(w + 16 * j);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_set1_ps(x[i * ldx + s]);
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(a, b[j], acc[i][j]);
    }
  } else if constexpr (std::is_same_v<X, BF16>) {
    __m512i b[NR];
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) b[j] = _mm512_load_si512(w + 32 * j);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512i a = broadcast_pair(x + i * ldx + 2 * s);
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j)
        acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)a, (__m512bh)b[j]);
    }
  } else {
    // G column groups at a time: their two widened vectors each, then each row's two
    // broadcasts against all of them (x's pair is swapped: xi[0] is k+1's value, xi[1] k's).
    // G is all NR groups where the accumulators, the widened vectors, the two broadcasts and
    // the mask fit the 32 registers, else fewer (the rows' broadcasts are then loaded again
    // for each G groups: cheaper than the spills).
    constexpr int G = fma_groups(MR, NR);
#pragma GCC unroll 4
    for (int j0 = 0; j0 < NR; j0 += G) {
      // Loads x again after this point: kept from the groups before, the broadcasts would
      // take the registers that G < NR frees.
      if (j0 > 0) asm volatile("" ::: "memory");
      __m512 odd[G], even[G];
#pragma GCC unroll 4
      for (int j = 0; j < G; ++j) {
        widen_pairs(_mm512_load_si512(w + 32 * (j0 + j)), odd[j], even[j]);
        if (keep != nullptr) {
          _mm512_store_ps(keep + 32 * NR * s + 16 * (j0 + j), odd[j]);
          _mm512_store_ps(keep + 32 * NR * s + 16 * NR + 16 * (j0 + j), even[j]);
        }
      }
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const float* xi = x + i * ldx + 2 * s;
        const __m512 a_odd = _mm512_set1_ps(xi[0]), a_even = _mm512_set1_ps(xi[1]);
#pragma GCC unroll 4
        for (int j = 0; j < G; ++j) {
          acc[i][j0 + j] = _mm512_fmadd_ps(a_odd, odd[j], acc[i][j0 + j]);
          acc[i][j0 + j] = _mm512_fmadd_ps(a_even, even[j], acc[i][j0 + j]);
        }
      }
    }
  }
}

// A tile's end: with `resume` the sum so far in `partial` is added; the result is rounded to
// Out into y (valid_cols of its columns) when y is given, else kept in `partial`.
template <typename Out, int MR, int NR>
inline void finish(__m512 (&acc)[MR][NR], float* partial, bool resume, Out* y, int64_t ldy,
                   int64_t valid_cols) {
  constexpr int64_t NB = 16 * NR;
  if (resume) {
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j)
        acc[i][j] = _mm512_add_ps(acc[i][j], _mm512_loadu_ps(partial + i * NB + 16 * j));
  }
  if (y == nullptr) {
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) _mm512_storeu_ps(partial + i * NB + 16 * j, acc[i][j]);
    return;
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) {
      const int64_t valid = valid_cols - 16 * j;
      Out* out = y + i * ldy + 16 * j;
      if constexpr (std::is_same_v<Out, float>) {
        if (valid >= 16)
          _mm512_storeu_ps(out, acc[i][j]);
        else if (valid > 0)
          _mm512_mask_storeu_ps(out, tail_mask(valid), acc[i][j]);
      } else {
        const __m256i packed = to_bf16(acc[i][j]);
        if (valid >= 16)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), packed);
        else if (valid > 0)
          _mm256_mask_storeu_epi16(out, tail_mask(valid), packed);
      }
    }
}

// MR rows x NB = 16 * NR columns, over `steps` steps of one panel starting at w (x already
// offset to the same k). The accumulators start at zero; with `resume` the sum so far in
// `partial` ([MR][NB] floats) is added at the end, so each chunk of k is summed on its own
// and the chunks' sums are summed after: rounding error grows with chunk + K / chunk terms,
// not with K (sequential fp32 sums over K = 1536 were 2.4x further from float64 than MKL's).
// The result ends in y (rounded to Out) when y is given, else in `partial`. pf_lines cache
// lines from pf on are prefetched, spread over the steps. `keep`: as step()'s.
template <typename X, typename W, typename Out, int MR, int NR>
void tile(const X* x, int64_t ldx, const W* w, int64_t steps, float* partial, bool resume,
          Out* y, int64_t ldy, int64_t valid_cols, const char* pf, int64_t pf_lines,
          float* keep) {
  constexpr int64_t NB = 16 * NR;
  constexpr int64_t kStep = 4 * NB / sizeof(W);  // elements of w per step
  __m512 acc[MR][NR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j)
      acc[i][j] = _mm512_setzero_ps();

  if (pf_lines > 0) {
    // pf_lines cache lines from pf on, spread evenly over the steps (Bresenham).
    int64_t due = 0;
    for (int64_t s = 0; s < steps; ++s, w += kStep) {
      dense_prefetch::spread(due, pf, pf_lines, steps);
      step<X, W, MR, NR>(acc, x, ldx, s, w, keep);
    }
  } else {
#pragma GCC unroll 2
    for (int64_t s = 0; s < steps; ++s, w += kStep) step<X, W, MR, NR>(acc, x, ldx, s, w, keep);
  }

  finish<Out, MR, NR>(acc, partial, resume, y, ldy, valid_cols);
}

// One row over G panels side by side (a decode step of one sequence): on each panel the
// sums of tile<T, T, T, 1, NR>, but the G panels are read in the same loop, G sequential
// streams from memory instead of one, which keeps more lines in flight through the hardware
// prefetchers (none requested here). `stride`: elements from one panel to the next;
// partial: [G][NB] floats; y: the first panel's outputs, `valid[g]` columns of panel g.
template <typename T, int NR, int G>
void row_streams(const T* x, const T* w, int64_t stride, int64_t steps, float* partial,
                 bool resume, T* y, const int64_t* valid) {
  constexpr int64_t NB = 16 * NR;
  constexpr int64_t kStep = 4 * NB / sizeof(T);
  __m512 acc[G][1][NR];
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) acc[g][0][j] = _mm512_setzero_ps();
  for (int64_t s = 0; s < steps; ++s, w += kStep) {
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) step<T, T, 1, NR>(acc[g], x, 0, s, w + g * stride, nullptr);
  }
#pragma GCC unroll 8
  for (int g = 0; g < G; ++g)
    finish<T, 1, NR>(acc[g], partial + g * NB, resume, y == nullptr ? nullptr : y + g * NB, 0,
                     valid[g]);
}

template <typename X, typename W, typename Out>
using TileFn = void (*)(const X*, int64_t, const W*, int64_t, float*, bool, Out*, int64_t,
                        int64_t, const char*, int64_t, float*);

// Largest row block per panel width: MR * NR accumulators plus NR weight vectors and a
// broadcast must fit the 32 vector registers (the FMA step fits itself: fma_groups).
template <int NR>
constexpr int max_rows() {
  return NR <= 2 ? 12 : NR == 3 ? 8 : 6;
}

template <typename X, typename W, typename Out, int NR, int... Rows>
constexpr auto make_table(std::integer_sequence<int, Rows...>) {
  return std::array<TileFn<X, W, Out>, sizeof...(Rows)>{&tile<X, W, Out, Rows + 1, NR>...};
}

// tile<X, W, Out, MR, NR> for MR = 1 .. max_rows<NR>(), indexed by MR - 1.
template <typename X, typename W, typename Out, int NR>
constexpr auto tiles() {
  return make_table<X, W, Out, NR>(std::make_integer_sequence<int, max_rows<NR>()>{});
}

}  // namespace
}  // namespace dense_tile
