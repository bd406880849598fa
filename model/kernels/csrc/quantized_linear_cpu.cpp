// y = x · Wᵀ with W kept as llama.cpp's Q4_1, Q8_0 or Q5_0 codes, its F16 or BF16 values, or
// its other types rewritten as blocks of 32 with fp32 scales (model/gguf_codes.py: Q4_0 and
// Q4_K as Q4_K's form, Q5_1 and Q5_K as Q5_K's, Q6_K as its own) (CPU, fp32 arithmetic;
// AVX-512, or AVX2 with FMA and F16C where AVX-512 is missing).
//
// Exact to the fp32 model: each weight is dequantized in fp32 exactly as the GGUF reference
// does (d * q + m; d * q is exact in fp32, so one rounding), then multiplied with x by FMA.
// Only the order of the sums differs from an fp32 matmul on the dequantized weights.
//
// Layout (repacked once at load, see model/quantized.py): output rows in groups of 16, one
// fp32 lane each, so one weight vector serves 16 outputs and a row of x is only ever
// broadcast. Per group and block of 32 inputs, contiguous:
//   Q4_1, 320 bytes: d[16] fp16, m[16] fp16, codes[16][16]: byte [j][r] holds row r's weight
//                    j in its low nibble and weight j + 16 in its high one (as in the GGUF);
//   Q8_0, 544 bytes: d[16] fp16, codes[32][16] int8: [k][r];
//   Q5_0, Q4_K, Q6_K, Q5_K, F16, BF16: see their structs (quantized_kernel.h).
// Groups follow one another: [groups][blocks][bytes].
//
// Threads split the output groups; each reads its codes from memory once per call. Up to 8
// rows of x, a tile keeps every row's accumulators in registers and unpacks each block once
// for all of them; with more rows, each block is dequantized once into a small buffer that
// every 8-row tile then reads. Either way a block's products are summed apart first, then
// added to running totals (see `tile`).
//
// The code is written once (quantized_kernel.h) over 16-lane vectors. This file gives it
// AVX-512's (one register each) and dispatches at run time; quantized_linear_avx2.cpp gives
// it AVX2's (two registers each, so 4-row tiles of one group: 16 registers instead of 32).
// Both compute every output lane with the same FMAs in the same order within a block; only
// how a block's 32 products are split between one or two chains (kOneChain) may differ.
#include "kernel_api.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "quantized_checks.h"

// This region's code may use AVX-512; the entry points below check the CPU before calling it.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
namespace quantized_avx512 {

using V = __m512;
using VI = __m512i;
constexpr int kMaxRows = 8, kGroups = 2, kOneChain = 8;

inline V vzero() { return _mm512_setzero_ps(); }
inline V vset1(float f) { return _mm512_set1_ps(f); }
inline V vfmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V vmul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
inline V vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, V v) { _mm512_storeu_ps(p, v); }
inline void vstore_first(float* p, V v, int64_t count) {
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << count) - 1), v);
}
inline V halves(const uint8_t* p) {  // exact
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline V bf16s(const uint8_t* p) {  // exact: the top half of an fp32
  const __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}
inline VI u8s(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline VI i8s(const uint8_t* p) {
  return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline VI iset1(int i) { return _mm512_set1_epi32(i); }
inline VI iand(VI a, VI b) { return _mm512_and_si512(a, b); }
inline VI ior(VI a, VI b) { return _mm512_or_si512(a, b); }
inline VI isub(VI a, VI b) { return _mm512_sub_epi32(a, b); }
template <int n>
inline VI isrli(VI v) { return _mm512_srli_epi32(v, n); }
inline VI isrl(VI v, int n) { return _mm512_srl_epi32(v, _mm_cvtsi32_si128(n)); }
inline VI isll(VI v, int n) { return _mm512_sll_epi32(v, _mm_cvtsi32_si128(n)); }
inline VI iload(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline V tofloat(VI v) { return _mm512_cvtepi32_ps(v); }
inline VI with_bit4(VI v, VI qh, int i) {  // bit i of qh moved to bit 4: v | (h & 0x10)
  const VI h = i >= 4 ? isrl(qh, i - 4) : isll(qh, 4 - i);
  return _mm512_ternarylogic_epi32(v, h, _mm512_set1_epi32(0x10), 0xF8);
}

#include "quantized_kernel.h"

}  // namespace quantized_avx512
#pragma GCC pop_options

// The AVX2 copy (quantized_linear_avx2.cpp).
namespace quantized_avx2 {
at::Tensor q4_1(const at::Tensor& x, const at::Tensor& packed, int64_t n);
at::Tensor q8_0(const at::Tensor& x, const at::Tensor& packed, int64_t n);
at::Tensor q5_0(const at::Tensor& x, const at::Tensor& packed, int64_t n);
at::Tensor q4_k(const at::Tensor& x, const at::Tensor& packed, int64_t n);
at::Tensor q6_k(const at::Tensor& x, const at::Tensor& packed, int64_t n);
at::Tensor q5_k(const at::Tensor& x, const at::Tensor& packed, int64_t n);
at::Tensor f16(const at::Tensor& x, const at::Tensor& packed, int64_t n);
at::Tensor bf16(const at::Tensor& x, const at::Tensor& packed, int64_t n);
}  // namespace quantized_avx2

namespace {
bool g_force_avx2 = false;  // set_quantized_avx2: the AVX2 copy even where AVX-512 is here

// AVX-512 where the CPU has it (and the AVX2 copy is not forced), else AVX2 with FMA and F16C.
bool use_avx512() {
  const bool avx512 = !g_force_avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512dq");
  TORCH_CHECK(avx512 || (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c")),
              "quantized_linear: this CPU has neither AVX-512 nor AVX2 with FMA and F16C");
  return avx512;
}

using Kernel = at::Tensor (*)(const at::Tensor&, const at::Tensor&, int64_t);

// The AVX-512 copy of a kernel or its AVX2 copy, as `use_avx512` says.
at::Tensor pick(Kernel avx512, Kernel avx2, const at::Tensor& x, const at::Tensor& packed,
                int64_t n) {
  return (use_avx512() ? avx512 : avx2)(x, packed, n);
}
}  // namespace

at::Tensor q4_1_linear(at::Tensor x, at::Tensor packed, int64_t out_features) {
  return pick(quantized_avx512::q4_1, quantized_avx2::q4_1, x, packed, out_features);
}

at::Tensor q8_0_linear(at::Tensor x, at::Tensor packed, int64_t out_features) {
  return pick(quantized_avx512::q8_0, quantized_avx2::q8_0, x, packed, out_features);
}

at::Tensor q5_0_linear(at::Tensor x, at::Tensor packed, int64_t out_features) {
  return pick(quantized_avx512::q5_0, quantized_avx2::q5_0, x, packed, out_features);
}

at::Tensor q4_k_linear(at::Tensor x, at::Tensor packed, int64_t out_features) {
  return pick(quantized_avx512::q4_k, quantized_avx2::q4_k, x, packed, out_features);
}

at::Tensor q6_k_linear(at::Tensor x, at::Tensor packed, int64_t out_features) {
  return pick(quantized_avx512::q6_k, quantized_avx2::q6_k, x, packed, out_features);
}

at::Tensor q5_k_linear(at::Tensor x, at::Tensor packed, int64_t out_features) {
  return pick(quantized_avx512::q5_k, quantized_avx2::q5_k, x, packed, out_features);
}

at::Tensor f16_linear(at::Tensor x, at::Tensor packed, int64_t out_features) {
  return pick(quantized_avx512::f16, quantized_avx2::f16, x, packed, out_features);
}

at::Tensor bf16_linear(at::Tensor x, at::Tensor packed, int64_t out_features) {
  return pick(quantized_avx512::bf16, quantized_avx2::bf16, x, packed, out_features);
}

void set_quantized_avx2(bool on) { g_force_avx2 = on; }
// Also read by the int8-activation matmuls (q4_1_int8act_cpu.cpp): one switch for every
// quantized kernel's AVX2 copy.
bool quantized_avx2_forced() { return g_force_avx2; }
