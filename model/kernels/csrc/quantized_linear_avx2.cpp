// The quantized matmul of quantized_linear_cpu.cpp (read its header first) for CPUs with
// AVX2, FMA and F16C but no AVX-512 (AMD Zen 2-3, Intel before Skylake-SP): the same code
// (quantized_kernel.h) over 16-lane vectors of two 8-lane registers each. With 16 registers
// instead of 32, a tile is up to 4 rows of one group of 16 outputs: 8 registers of
// accumulators, 4 for a block's scales, 4 for the weights of a step.
#include "kernel_api.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "quantized_checks.h"

// This file's code (its own object in the kernels module) may use AVX2, FMA and F16C even
// where -march=native lacks them; quantized_linear_cpu.cpp checks the CPU before calling it.
#pragma GCC target("avx2,fma,f16c")

namespace quantized_avx2 {

struct V {  // lanes 0-7, 8-15
  __m256 a, b;
};
struct VI {
  __m256i a, b;
};
constexpr int kMaxRows = 4, kGroups = 1, kOneChain = 4;

inline V vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V vset1(float f) {
  const __m256 s = _mm256_set1_ps(f);
  return {s, s};
}
inline V vfmadd(V x, V y, V z) { return {_mm256_fmadd_ps(x.a, y.a, z.a), _mm256_fmadd_ps(x.b, y.b, z.b)}; }
inline V vmul(V x, V y) { return {_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)}; }
inline V vadd(V x, V y) { return {_mm256_add_ps(x.a, y.a), _mm256_add_ps(x.b, y.b)}; }
inline V vload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void vstore(float* p, V v) {
  _mm256_storeu_ps(p, v.a);
  _mm256_storeu_ps(p + 8, v.b);
}
inline void vstore_first(float* p, V v, int64_t count) {
  if (count >= 16) return vstore(p, v);
  alignas(32) float lanes[16];
  vstore(lanes, v);
  std::memcpy(p, lanes, sizeof(float) * count);
}
inline V halves(const uint8_t* p) {  // exact
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)))};
}
inline V bf16s(const uint8_t* p) {  // exact: the top half of an fp32
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(lo), 16)),
          _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(hi), 16))};
}
inline VI u8s(const uint8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_cvtepu8_epi32(b), _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8))};
}
inline VI i8s(const uint8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_cvtepi8_epi32(b), _mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))};
}
inline VI iset1(int i) {
  const __m256i s = _mm256_set1_epi32(i);
  return {s, s};
}
inline VI iand(VI x, VI y) { return {_mm256_and_si256(x.a, y.a), _mm256_and_si256(x.b, y.b)}; }
inline VI ior(VI x, VI y) { return {_mm256_or_si256(x.a, y.a), _mm256_or_si256(x.b, y.b)}; }
inline VI isub(VI x, VI y) { return {_mm256_sub_epi32(x.a, y.a), _mm256_sub_epi32(x.b, y.b)}; }
template <int n>
inline VI isrli(VI v) { return {_mm256_srli_epi32(v.a, n), _mm256_srli_epi32(v.b, n)}; }
inline VI isrl(VI v, int n) {
  const __m128i count = _mm_cvtsi32_si128(n);
  return {_mm256_srl_epi32(v.a, count), _mm256_srl_epi32(v.b, count)};
}
inline VI isll(VI v, int n) {
  const __m128i count = _mm_cvtsi32_si128(n);
  return {_mm256_sll_epi32(v.a, count), _mm256_sll_epi32(v.b, count)};
}
inline VI iload(const uint8_t* p) {
  return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32))};
}
inline V tofloat(VI v) { return {_mm256_cvtepi32_ps(v.a), _mm256_cvtepi32_ps(v.b)}; }
inline VI with_bit4(VI v, VI qh, int i) {  // bit i of qh moved to bit 4
  return ior(v, iand(i >= 4 ? isrl(qh, i - 4) : isll(qh, 4 - i), iset1(0x10)));
}

#include "quantized_kernel.h"

}  // namespace quantized_avx2
