// The fp32 product of dense_linear.cpp (read its header first) on CPUs with AMX, for many
// rows, with fp32's accuracy from bf16 tile multiplies.
//
// Every fp32 value is split exactly into three bf16 values, v = v1 + v2 + v3. x is split by
// rounding (v1 = v rounded to bf16, v2 the remainder rounded, v3 what is left: at most 8
// significant bits, exact); the weights by truncation (the top 8 significant bits, the next
// 8 of the remainder, the rest), which needs no conversion: each piece is a float whose low
// 16 bits are zero. Each product of two pieces is exact in fp32 (8 x 8 bits); of the nine,
// the three smallest (x2 w3, x3 w2, x3 w3: below 2^-23 of |x w|, about fp32's own rounding
// of the product) are left out, and the other six are summed by the tile unit in fp32, in
// one accumulator per output over all of K. Six tile multiplies do the work of one fp32
// multiply-add per output and k, at 16 times the FMAs' multiply-adds per instruction.
//
// Layout. x is split once per call into three bf16 copies, rows padded to whole A tiles (16)
// with zero rows and k to whole tile depths (32) with zeros. Each packed fp32 panel (K-major,
// [K, NB]) is split, as it streams from memory, into three bf16 buffers in the B operand's
// layout (a k pair of each column side by side: 16 pairs of 16 columns are one B tile), which
// every row block then reads from cache. Tiles: 0-3 the sums of the panel's column groups,
// 4-6 x1, x2, x3, 7 the B tile of the moment.
//
// An experiment, measured and not kept: see docs/performance.md (fp32 on AMX).
#include <ATen/Parallel.h>
#include "kernel_api.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "dense_prefetch.h"
#include "dense_scratch.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")

namespace dense_amx_f32 {
namespace {

using B = c10::BFloat16;
constexpr int64_t kRows = 16;   // rows per block (an A tile's)
constexpr int64_t kDepth = 32;  // k per tile multiply (an A tile's columns, a B tile's pairs)

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void configure() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  asm volatile("ldtilecfg %0" : : "m"(cfg));  // all 64 bytes (see dense_linear_amx.cpp)
}

inline __m512 widen(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

inline __m256i to_bf16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }  // nearest even

// 16 floats as three bf16 vectors that sum to them exactly (see the header).
inline void split(__m512 v, __m256i (&piece)[3]) {
  piece[0] = to_bf16(v);
  v = _mm512_sub_ps(v, widen(piece[0]));  // exact: v less its own rounding
  piece[1] = to_bf16(v);
  piece[2] = to_bf16(_mm512_sub_ps(v, widen(piece[1])));
}

// x [M, K] as three bf16 copies [rows, depth] (rows and depth padded with zeros).
void split_x(const float* x, int64_t M, int64_t K, int64_t rows, int64_t depth, B* out[3]) {
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t k = 0; k < depth; k += 16) {
      const int64_t valid = m < M ? std::clamp<int64_t>(K - k, 0, 16) : 0;
      const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1u);
      __m256i piece[3];
      split(_mm512_maskz_loadu_ps(mask, x + m * K + k), piece);
      for (int i = 0; i < 3; ++i)
        _mm256_store_si256(reinterpret_cast<__m256i*>(out[i] + m * depth + k), piece[i]);
    }
  }
}

// A panel (NB = 16 * G columns, K-major, K rows) as three bf16 buffers of depth / 2 pairs x
// NB columns x 2 (rows past K are zeros), split by truncation: w1 is w's top 8 significant
// bits, w2 the next 8 of the remainder, w3 the rest (at most 8 bits: exact). Each piece is a
// float whose low 16 bits are zero, so two rows' pieces become one vector of pairs by a shift
// and an OR, without converting or permuting.
template <int G>
void split_panel(const float* panel, int64_t K, int64_t depth, B* const* out) {
  constexpr int64_t NB = 16 * G;
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t i = 0; i < depth / 2; ++i) {
    const int64_t k = 2 * i;
#pragma GCC unroll 4
    for (int64_t j = 0; j < G; ++j) {
      const __m512 a = k < K ? _mm512_load_ps(panel + k * NB + 16 * j) : _mm512_setzero_ps();
      const __m512 b = k + 1 < K ? _mm512_load_ps(panel + (k + 1) * NB + 16 * j)
                                 : _mm512_setzero_ps();
      const __m512i a1 = _mm512_and_si512(_mm512_castps_si512(a), high);
      const __m512i b1 = _mm512_and_si512(_mm512_castps_si512(b), high);
      const __m512 ar = _mm512_sub_ps(a, _mm512_castsi512_ps(a1));  // exact
      const __m512 br = _mm512_sub_ps(b, _mm512_castsi512_ps(b1));
      const __m512i a2 = _mm512_and_si512(_mm512_castps_si512(ar), high);
      const __m512i b2 = _mm512_and_si512(_mm512_castps_si512(br), high);
      const __m512i a3 = _mm512_castps_si512(_mm512_sub_ps(ar, _mm512_castsi512_ps(a2)));
      const __m512i b3 = _mm512_castps_si512(_mm512_sub_ps(br, _mm512_castsi512_ps(b2)));
      const int64_t at = (i * NB + 16 * j) * 2;
      _mm512_store_si512(out[0] + at, _mm512_or_si512(b1, _mm512_srli_epi32(a1, 16)));
      _mm512_store_si512(out[1] + at, _mm512_or_si512(b2, _mm512_srli_epi32(a2, 16)));
      _mm512_store_si512(out[2] + at, _mm512_or_si512(b3, _mm512_srli_epi32(a3, 16)));
    }
  }
}

// Column group J of a sub-step: its B tiles (the split panel's, `wo` elements in) against
// the three A tiles (4-6: x1, x2, x3) into accumulator J, in turn through tile 7. (A macro:
// the tile intrinsics take their tile numbers as literal text.)
#define NANO_AMX_F32_COLUMN(J)                                   \
  do {                                                           \
    _tile_loadd(7, w[0] + wo + 32 * (J), ws); /* x1 w1, x2 w1, x3 w1 */ \
    _tile_dpbf16ps(J, 4, 7);                                     \
    _tile_dpbf16ps(J, 5, 7);                                     \
    _tile_dpbf16ps(J, 6, 7);                                     \
    _tile_loadd(7, w[1] + wo + 32 * (J), ws); /* x1 w2, x2 w2 */ \
    _tile_dpbf16ps(J, 4, 7);                                     \
    _tile_dpbf16ps(J, 5, 7);                                     \
    _tile_loadd(7, w[2] + wo + 32 * (J), ws); /* x1 w3 */        \
    _tile_dpbf16ps(J, 4, 7);                                     \
  } while (0)

// One row block (16 rows of the split x) against a split panel of G column groups over all
// of its depth; the sums (16 x NB floats) are stored into `sums`.
template <int G>
void block_product(B* const* x, int64_t depth, B* const* w, float* sums, const char* pf,
                   int64_t pf_lines) {
  constexpr int64_t NB = 16 * G;
  _tile_zero(0);
  if constexpr (G > 1) _tile_zero(1);
  if constexpr (G > 2) _tile_zero(2);
  if constexpr (G > 3) _tile_zero(3);
  const int64_t xs = depth * sizeof(B), ws = NB * 2 * sizeof(B), subs = depth / kDepth;
  int64_t due = 0;
  for (int64_t s = 0; s < subs; ++s) {
    dense_prefetch::spread(due, pf, pf_lines, subs);
    const int64_t xo = s * kDepth, wo = s * kDepth * NB;
    _tile_loadd(4, x[0] + xo, xs);
    _tile_loadd(5, x[1] + xo, xs);
    _tile_loadd(6, x[2] + xo, xs);
    NANO_AMX_F32_COLUMN(0);
    if constexpr (G > 1) NANO_AMX_F32_COLUMN(1);
    if constexpr (G > 2) NANO_AMX_F32_COLUMN(2);
    if constexpr (G > 3) NANO_AMX_F32_COLUMN(3);
  }
  constexpr int64_t stride = NB * sizeof(float);
  _tile_stored(0, sums, stride);
  if constexpr (G > 1) _tile_stored(1, sums + 16, stride);
  if constexpr (G > 2) _tile_stored(2, sums + 32, stride);
  if constexpr (G > 3) _tile_stored(3, sums + 48, stride);
}

template <int G>
void run(const float* x, int64_t M, int64_t K, const float* packed, int64_t panels, int64_t N,
         float* y, int nthreads, int64_t prefetch) {
  constexpr int64_t NB = 16 * G;
  const int64_t blocks = (M + kRows - 1) / kRows, rows = blocks * kRows;
  const int64_t depth = (K + kDepth - 1) / kDepth * kDepth;
  // x's three copies; per thread, the split panel and one row block's sums.
  float* xs = dense_scratch::floats(dense_scratch::kX, 3 * rows * depth / 2);
  B* xp[3] = {reinterpret_cast<B*>(xs), reinterpret_cast<B*>(xs) + rows * depth,
              reinterpret_cast<B*>(xs) + 2 * rows * depth};
  split_x(x, M, K, rows, depth, xp);
  const int64_t w_floats = 3 * depth * NB / 2, per_thread = w_floats + kRows * NB;
  float* scratch = dense_scratch::floats(dense_scratch::kWide, nthreads * per_thread);
  const char* bytes = reinterpret_cast<const char*>(packed);
  const int64_t panel_bytes = K * NB * static_cast<int64_t>(sizeof(float));
  const int64_t total_bytes = panels * panel_bytes;

#pragma omp parallel num_threads(nthreads)
  {
    configure();
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t p0 = panels * t / nt, p1 = panels * (t + 1) / nt;
    float* mine = scratch + t * per_thread;
    B* wp[3] = {reinterpret_cast<B*>(mine), reinterpret_cast<B*>(mine) + depth * NB,
                reinterpret_cast<B*>(mine) + 2 * depth * NB};
    float* sums = mine + w_floats;
    for (int64_t p = p0; p < p1; ++p) {
      split_panel<G>(packed + p * K * NB, K, depth, wp);
      // The next panel is requested while this one's tiles multiply.
      const auto ahead = dense_prefetch::window(bytes, total_bytes, p * panel_bytes,
                                                prefetch ? panel_bytes : 0, panel_bytes / 64);
      const int64_t valid = std::min<int64_t>(NB, N - p * NB);
      for (int64_t b = 0; b < blocks; ++b) {
        B* const xb[3] = {xp[0] + b * kRows * depth, xp[1] + b * kRows * depth,
                          xp[2] + b * kRows * depth};
        block_product<G>(xb, depth, wp, sums, ahead.part_start(b, blocks),
                         ahead.part_lines(b, blocks));
        for (int64_t r = 0; r < kRows && b * kRows + r < M; ++r) {
          float* out = y + (b * kRows + r) * N + p * NB;
          for (int64_t j = 0; j < valid; j += 16) {
            const __mmask16 mask = valid - j >= 16 ? static_cast<__mmask16>(0xFFFF)
                                                   : static_cast<__mmask16>((1u << (valid - j)) - 1);
            _mm512_mask_storeu_ps(out + j, mask, _mm512_load_ps(sums + r * NB + j));
          }
        }
      }
    }
    _tile_release();
  }
}

#undef NANO_AMX_F32_COLUMN

}  // namespace

// y [M, N] = x [M, K] (fp32) @ the packed fp32 panels of width NB, at fp32's accuracy;
// dense_amx::amx_usable() must hold. chunk: unused (all of K is one sum); prefetch: request the
// next panel while the tiles multiply.
void linear_f32(const float* x, int64_t M, int64_t K, const float* packed, int64_t panels,
                int64_t NB, int64_t N, float* y, int nthreads, int64_t chunk, int64_t prefetch) {
  (void)chunk;
  switch (NB) {
    case 16: return run<1>(x, M, K, packed, panels, N, y, nthreads, prefetch);
    case 32: return run<2>(x, M, K, packed, panels, N, y, nthreads, prefetch);
    case 48: return run<3>(x, M, K, packed, panels, N, y, nthreads, prefetch);
    default: return run<4>(x, M, K, packed, panels, N, y, nthreads, prefetch);
  }
}

}  // namespace dense_amx_f32
#pragma GCC pop_options
