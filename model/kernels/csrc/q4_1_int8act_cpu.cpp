// y ≈ x · Wᵀ from Q4_1 or Q8_0 codes with x rounded to int8 per block of 32 (CPU, AVX512-VNNI).
//
// The opt-in speed mode of --weights q4_1, multiplying as llama.cpp does for its quantized
// formats: each row of x is quantized per block of 32 inputs, symmetric and to nearest,
//   dx = max|x| / 127,  xq = round(x / dx) in [-127, 127],
// and a block's 32 products become one integer dot product, the scales applied after:
//   Q4_1 (w = d q + m, q in 0..15):    sum_k w_k x_k  ≈  dx (d sum_k q_k xq_k + m sum_k xq_k)
//   Q8_0 (w = d q, q in -128..127):    sum_k w_k x_k  ≈  dx d (sum_k u_k xq_k - 128 sum_k xq_k)
// `vpdpbusd` multiplies unsigned bytes by signed ones (xq) and adds each 4 adjacent products
// into an int32 lane: 16 output rows by 4 inputs in one instruction, where the exact kernel
// (quantized_linear_cpu.cpp) needs 4 FMAs and the unpacking for 16 by 1. Q4_1's codes are
// unsigned already; Q8_0's are stored as u = q + 128 (0..255), and the 128 sum(xq) that adds
// is taken off in the integers, so Q8_0's block sum is exact. Only x's rounding to 8 bits
// changes the result (tests/model/test_q4_1_int8act.py states how much).
//
// Layout (packed once at load, model/quantized.py): output rows in groups of 16; per group
// and block of 32 inputs, contiguous bytes:
//   Q4_1, 320: d[16] fp16, m[16] fp16, then codes[4][16][4]: byte [c][r][t] is row r's GGUF
//     code byte j = 4c + t (weight j in its low nibble, j + 16 in its high one). One 64-byte
//     load gives each of 16 lanes (rows) 4 consecutive inputs: the low nibbles pair with
//     xq[4c .. 4c + 3], the high ones with xq[16 + 4c .. 16 + 4c + 3].
//   Q8_0, 544: d[16] fp16, then u[8][16][4]: byte [c][r][t] is row r's weight 4c + t.
// Groups follow one another: [groups][blocks][bytes].
//
// Threads first quantize x's blocks between them, then split the output groups. Each group
// is multiplied in register tiles of up to 8 rows of x: the tile's 8 x 16 sums stay in
// registers over all blocks, and each block's codes are unpacked once per tile into 8
// registers that all its rows reuse (8 vpdpbusd per row and block, each taking its 4
// activation bytes as a broadcast memory operand). A group's codes (15 KB at 1536 inputs)
// stay in L1 or L2 for its next row tile. Only AVX-512F/BW/VL/DQ and VNNI: no CPU-specific tuning.
// The parts that do not depend on the instruction set are in int8act_kernel.h; CPUs without
// VNNI run the AVX2 copy (q4_1_int8act_avx2.cpp), chosen at run time.
#include "kernel_api.h"

#include "quantized_checks.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <vector>

// This region's code is AVX-512 with VNNI; the entry points below check the CPU before
// calling it.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
namespace int8act_avx512 {

#include "int8act_blocks.h"

namespace {
constexpr int kRows = 8;  // 8 code registers, 8 sums and the scales: well inside 32 registers
using V = __m512;
inline V vzero() { return _mm512_setzero_ps(); }
inline void vstore_first(float* p, V v, int64_t count) {
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << count) - 1), v);
}

// Explicit rounding: these intrinsics are opaque to -ffast-math, so the quantization is
// exactly IEEE division and multiplication, which the tests reproduce in PyTorch bit for bit.
constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
inline float divide(float a, float b) {
  return _mm_cvtss_f32(_mm_div_round_ss(_mm_set_ss(a), _mm_set_ss(b), kNearest));
}

inline __m512i round_codes(__m512 x, __m512 inverse) {
  const __m512i q = _mm512_cvt_roundps_epi32(_mm512_mul_round_ps(x, inverse, kNearest),
                                             kNearest);  // to nearest, ties to even
  return _mm512_max_epi32(_mm512_min_epi32(q, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
}

// One block of 32 inputs: codes (32 bytes), scale and scaled sum.
inline void quantize_block(const float* x, int8_t* codes, float* scale, float* scaled_sum,
                           int32_t* sum) {
  const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
  const float peak = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  const float dx = peak >= kTiniest ? divide(peak, 127.0f) : 0.0f;
  const __m512 inverse = _mm512_set1_ps(dx > 0.0f ? divide(1.0f, dx) : 0.0f);
  const __m512i qa = round_codes(a, inverse), qb = round_codes(b, inverse);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(codes), _mm512_cvtepi32_epi8(qa));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + 16), _mm512_cvtepi32_epi8(qb));
  *scale = dx;
  *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
  *scaled_sum = dx * static_cast<float>(*sum);
}

// One group's block, unpacked: c[i] holds each row's 4 codes that pair with words[i] of a
// block of x (inputs 4i .. 4i + 3).
struct Codes {
  __m512i c[8];
  __m512 d, m;  // m: Q4_1's minimums (unused for Q8_0)
};

inline __m512 halves(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// The two code formats: bytes per group and block, unpacking, and a block's contribution.
struct Q4_1 {
  static constexpr int64_t kBytes = 320;
  static void load(const uint8_t* p, Codes& c) {
    c.d = halves(p);
    c.m = halves(p + 32);
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    for (int i = 0; i < 4; ++i) {
      const __m512i v = _mm512_loadu_si512(p + 64 + 64 * i);
      c.c[i] = _mm512_and_si512(v, nibble);  // weights 4i .. 4i + 3
      c.c[4 + i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);  // 16 + 4i ..
    }
  }
  // total + dx (d · dot(q, xq) + m · sum(xq)); |dot| < 2^16: exact in fp32.
  static __m512 add(const Codes& c, __m512i dot, float scale, float scaled_sum, int32_t,
                    __m512 total) {
    total = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(c.d, _mm512_set1_ps(scale)),
                            total);
    return _mm512_fmadd_ps(c.m, _mm512_set1_ps(scaled_sum), total);
  }
};

struct Q8_0 {
  static constexpr int64_t kBytes = 544;
  static void load(const uint8_t* p, Codes& c) {
    c.d = halves(p);
    for (int i = 0; i < 8; ++i) c.c[i] = _mm512_loadu_si512(p + 32 + 64 * i);
  }
  // total + dx d (dot(u, xq) - 128 sum(xq)): the integer difference is dot(q, xq), exact,
  // and |dot(q, xq)| <= 32 * 128 * 127 < 2^24 converts to fp32 exactly.
  static __m512 add(const Codes& c, __m512i dot, float scale, float, int32_t sum,
                    __m512 total) {
    const __m512i exact = _mm512_sub_epi32(dot, _mm512_set1_epi32(128 * sum));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_mul_ps(c.d, _mm512_set1_ps(scale)),
                           total);
  }
};

// One row of x against one group's block: the 8 dot products, then the scales.
template <class F>
inline __m512 block_product(const Codes& c, const QuantizedX& xq, int64_t i, __m512 total) {
  const int32_t* words = xq.words + i * (kBlock / 4);
  __m512i acc = _mm512_setzero_si512();
  for (int k = 0; k < 8; ++k) acc = _mm512_dpbusd_epi32(acc, c.c[k], _mm512_set1_epi32(words[k]));
  return F::add(c, acc, xq.scale[i], xq.scaled_sum[i], xq.sum[i], total);
}

}  // namespace

#include "int8act_kernel.h"

}  // namespace int8act_avx512
#pragma GCC pop_options

// The AVX2 copy (q4_1_int8act_avx2.cpp).
namespace int8act_avx2 {
at::Tensor q4_1(const at::Tensor& x, const at::Tensor& packed, int64_t n);
at::Tensor q8_0(const at::Tensor& x, const at::Tensor& packed, int64_t n);
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x);
}  // namespace int8act_avx2

bool quantized_avx2_forced();  // quantized_linear_cpu.cpp: set_quantized_avx2

namespace {
// AVX-512 with VNNI where the CPU has it (and the AVX2 copies are not forced), else AVX2 with
// FMA and F16C.
bool use_vnni() {
  const bool vnni = !quantized_avx2_forced() && __builtin_cpu_supports("avx512f") &&
                    __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                    __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
  TORCH_CHECK(vnni || (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                       __builtin_cpu_supports("f16c")),
              "int8act_linear: this CPU has neither AVX512-VNNI nor AVX2 with FMA and F16C");
  return vnni;
}
}  // namespace

at::Tensor q4_1_int8act_linear(at::Tensor x, at::Tensor packed, int64_t N) {
  return use_vnni() ? int8act_avx512::q4_1(x, packed, N) : int8act_avx2::q4_1(x, packed, N);
}

at::Tensor q8_0_int8act_linear(at::Tensor x, at::Tensor packed, int64_t N) {
  return use_vnni() ? int8act_avx512::q8_0(x, packed, N) : int8act_avx2::q8_0(x, packed, N);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_rows_int8(at::Tensor x) {
  return use_vnni() ? int8act_avx512::quantize_rows(x) : int8act_avx2::quantize_rows(x);
}
