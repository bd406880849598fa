// The int8-activation matmul of q4_1_int8act_cpu.cpp (read its header first) for CPUs with
// AVX2, FMA and F16C but no AVX512-VNNI (AMD Zen 2-3, Intel before Ice Lake): the same
// quantization of x, the same packed codes and the same integer sums, hence the same results
// bit for bit; what differs is how a block's dot products are formed without `vpdpbusd`.
//
// A register holds 8 of a group's 16 output rows (4 codes each), so each code line of 64
// bytes is two registers, and a group's sums are two registers per row of x.
// - Q4_1: `vpmaddubsw` multiplies the unsigned codes (0..15) by x's signed bytes and adds
//   adjacent pairs into int16 (|pair| <= 2 * 15 * 127 = 3810); the 8 products of a block's
//   code registers are added in int16 (|sum| <= 30480 < 2^15, so nothing saturates or wraps),
//   and one `vpmaddwd` by ones makes each row's int32 dot product.
// - Q8_0, stored as u = q + 128: its pairs would reach 2 * 255 * 127 and saturate int16, so
//   the codes are made signed again (q = u ^ 0x80) and multiplied as |q| (unsigned, 0..128)
//   by x's bytes with q's sign (|xq| <= 127, so the sign never overflows): pairs up to
//   2 * 128 * 127 = 32512 fit int16, and each product register goes to int32 at once. That
//   sum is dot(q, xq) itself, exact, where the VNNI copy takes 128 sum(xq) off dot(u, xq).
// Tiles of 4 rows of x: 8 registers of sums; the unpacked codes stay in L1.
#include "kernel_api.h"

#include "quantized_checks.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <vector>

// This file's code (its own object in the kernels module) may use AVX2, FMA and F16C even
// where -march=native lacks them; q4_1_int8act_cpu.cpp checks the CPU before calling it.
#pragma GCC target("avx2,fma,f16c")

namespace int8act_avx2 {

#include "int8act_blocks.h"

namespace {
constexpr int kRows = 4;

struct V {  // a group's rows 0-7 and 8-15
  __m256 a, b;
};
inline V vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline void vstore_first(float* p, V v, int64_t count) {
  alignas(32) float lanes[kLanes];
  _mm256_store_ps(lanes, v.a);
  _mm256_store_ps(lanes + 8, v.b);
  std::memcpy(p, lanes, sizeof(float) * count);
}

inline float max_lane(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline int32_t sum_lanes(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

// divss itself (a builtin, which -ffast-math does not turn into a reciprocal): the VNNI
// copy's explicitly rounded division, as the default rounding is to nearest.
inline float divide(float a, float b) {
  return _mm_cvtss_f32(_mm_div_ss(_mm_set_ss(a), _mm_set_ss(b)));
}

inline __m256i round_codes(__m256 x, __m256 inverse) {
  const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(x, inverse));  // to nearest, ties even
  return _mm256_max_epi32(_mm256_min_epi32(q, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
}

// One block of 32 inputs: codes (32 bytes), scale, scaled sum and sum, as the VNNI copy.
inline void quantize_block(const float* x, int8_t* codes, float* scale, float* scaled_sum,
                           int32_t* sum) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 v[4], peak = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    peak = _mm256_max_ps(peak, _mm256_and_ps(v[i], magnitude));
  }
  const float top = max_lane(peak);
  const float dx = top >= kTiniest ? divide(top, 127.0f) : 0.0f;
  const __m256 inverse = _mm256_set1_ps(dx > 0.0f ? divide(1.0f, dx) : 0.0f);
  __m256i q[4];
  for (int i = 0; i < 4; ++i) q[i] = round_codes(v[i], inverse);
  // packs works within 128-bit lanes: the bytes come out in runs of 4 codes, q[0]'s first
  // 4, q[1]'s, q[2]'s, q[3]'s, then each one's last 4; the permute puts them in input order.
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                           _mm256_packs_epi32(q[2], q[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes),
                      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  *scale = dx;
  *sum = sum_lanes(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
  *scaled_sum = dx * static_cast<float>(*sum);
}

// One group's block, unpacked: c[h][i] holds rows 8h .. 8h + 7's 4 codes that pair with
// words[i] of a block of x (inputs 4i .. 4i + 3); for Q8_0 as |q|, with q itself in q.
struct Codes {
  __m256i c[2][8], q[2][8];
  V d, m;  // m: Q4_1's minimums (unused for Q8_0)
};

inline V halves(const uint8_t* p) {  // 16 fp16 -> fp32, exact
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)))};
}

inline __m256i load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// total + dx (d dot + m sum(xq)) per half, in the VNNI copy's order (Q8_0: m = 0 term left out).
inline __m256 scaled(__m256i dot, __m256 d, float scale, __m256 total) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, _mm256_set1_ps(scale)), total);
}

struct Q4_1 {
  static constexpr int64_t kBytes = 320;
  static void load(const uint8_t* p, Codes& c) {
    c.d = halves(p);
    c.m = halves(p + 32);
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 4; ++i) {
        const __m256i v = load32(p + 64 + 64 * i + 32 * h);
        c.c[h][i] = _mm256_and_si256(v, nibble);  // weights 4i .. 4i + 3
        c.c[h][4 + i] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);  // 16 + 4i ..
      }
  }
  static __m256i dot(const Codes& c, int h, const __m256i (&x)[8]) {
    __m256i pairs = _mm256_maddubs_epi16(c.c[h][0], x[0]);
    for (int k = 1; k < 8; ++k) pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(c.c[h][k], x[k]));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
  }
  static V add(const Codes& c, const __m256i (&dots)[2], float scale, float scaled_sum,
               V total) {
    const __m256 s = _mm256_set1_ps(scaled_sum);
    return {_mm256_fmadd_ps(c.m.a, s, scaled(dots[0], c.d.a, scale, total.a)),
            _mm256_fmadd_ps(c.m.b, s, scaled(dots[1], c.d.b, scale, total.b))};
  }
};

struct Q8_0 {
  static constexpr int64_t kBytes = 544;
  static void load(const uint8_t* p, Codes& c) {
    c.d = halves(p);
    const __m256i offset = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 8; ++i) {
        c.q[h][i] = _mm256_xor_si256(load32(p + 32 + 64 * i + 32 * h), offset);  // u - 128
        c.c[h][i] = _mm256_abs_epi8(c.q[h][i]);  // -128 gives 0x80: 128 as unsigned
      }
  }
  static __m256i dot(const Codes& c, int h, const __m256i (&x)[8]) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i sum = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      const __m256i pairs = _mm256_maddubs_epi16(c.c[h][k], _mm256_sign_epi8(x[k], c.q[h][k]));
      sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, ones));
    }
    return sum;
  }
  static V add(const Codes& c, const __m256i (&dots)[2], float scale, float, V total) {
    return {scaled(dots[0], c.d.a, scale, total.a), scaled(dots[1], c.d.b, scale, total.b)};
  }
};

// One row of x against one group's block: both halves' dot products, then the scales.
template <class F>
inline V block_product(const Codes& c, const QuantizedX& xq, int64_t i, V total) {
  const int32_t* words = xq.words + i * (kBlock / 4);
  __m256i x[8];
  for (int k = 0; k < 8; ++k) x[k] = _mm256_set1_epi32(words[k]);
  const __m256i dots[2] = {F::dot(c, 0, x), F::dot(c, 1, x)};
  return F::add(c, dots, xq.scale[i], xq.scaled_sum[i], total);
}

}  // namespace

#include "int8act_kernel.h"

}  // namespace int8act_avx2
