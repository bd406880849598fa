// y = x · Wᵀ with W kept as llama.cpp's Q4_1, Q8_0 or Q5_0 codes, or its Q4_K / Q6_K codes
// rewritten as blocks of 32 with fp32 scales (model/gguf_codes.py) (CPU, AVX-512, fp32
// arithmetic).
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
//   Q5_0, Q4_K, Q6_K: see their structs below.
// Groups follow one another: [groups][blocks][bytes].
//
// Threads split the output groups; each reads its codes from memory once per call. Up to 8
// rows of x, a tile keeps every row's accumulators in registers and unpacks each block once
// for all of them; with more rows, each block is dequantized once into a small buffer that
// every 8-row tile then reads. Either way a block's products are summed apart first, then
// added to running totals (see `tile`).
#include <torch/extension.h>

#include <immintrin.h>
#include <omp.h>

// This file's code (and only this file's: it is its own object in the kernels module) is
// AVX-512; model/quantized.py checks the CPU before calling it.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")

#include <algorithm>
#include <vector>


namespace {
constexpr int64_t kLanes = 16;  // output rows per group
constexpr int64_t kBlock = 32;  // inputs per block
// Blocks to prefetch ahead of use. With the hardware prefetcher alone, each core streamed
// codes at ~9 GB/s and one row through 30 layers took 4.1 ms (2 threads); prefetching 2 to 8
// blocks ahead brought that to ~2.4 ms, with no clear winner within the noise.
constexpr int64_t kAhead = 8;

inline __m512 load_halves(const uint8_t* p) {  // 16 fp16 -> 16 fp32, exact
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Code byte j of each of the group's 16 rows (16 bytes, row fastest) as fp32: its low nibble
// (weight j) and its high one (weight j + 16), for the 4-bit formats.
inline void nibbles(const uint8_t* codes, int j, __m512& lo, __m512& hi) {
  const __m512i b = _mm512_cvtepu8_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + kLanes * j)));
  lo = _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(0x0F)));
  hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
}

// Int8 code k of each of the group's 16 rows (16 bytes, row fastest) as fp32.
inline __m512 int8s(const uint8_t* codes, int k) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + kLanes * k))));
}

// The 4-bit formats with a scale and a min per row: w = d * q + m in one FMA, q a code of
// `nibbles`. Q4_1 and Q4_K are this, loaded from their own bytes.
struct ScaleMinNibbles {
  __m512 d, m;
  const uint8_t* codes;
  ScaleMinNibbles() = default;
  ScaleMinNibbles(__m512 d_, __m512 m_, const uint8_t* codes_) : d(d_), m(m_), codes(codes_) {}
  // The weights k = j and k = j + 16 of the group's 16 rows.
  inline void pair(int j, __m512& lo, __m512& hi) const {
    nibbles(codes, j, lo, hi);
    lo = _mm512_fmadd_ps(lo, d, m);
    hi = _mm512_fmadd_ps(hi, d, m);
  }
};

struct Q4_1 : ScaleMinNibbles {
  static constexpr int64_t kBytes = 320;
  Q4_1() = default;
  explicit Q4_1(const uint8_t* p)
      : ScaleMinNibbles(load_halves(p), load_halves(p + 32), p + 64) {}
};

struct Q8_0 {
  static constexpr int64_t kBytes = 544;
  __m512 d;
  const uint8_t* codes;
  Q8_0() = default;
  explicit Q8_0(const uint8_t* p) : d(load_halves(p)), codes(p + 32) {}
  inline __m512 at(int k) const { return _mm512_mul_ps(int8s(codes, k), d); }
  inline void pair(int j, __m512& lo, __m512& hi) const {
    lo = at(j);
    hi = at(j + 16);
  }
};

// Q5_0, 352 bytes: d[16] fp16, qh[16] uint32 (bit i: weight i's fifth bit), codes[16][16] as
// Q4_1's. w = d * (q - 16): exact in fp32 (11 + 5 significant bits), as the GGUF reference.
struct Q5_0 {
  static constexpr int64_t kBytes = 352;
  __m512 d;
  __m512i qh;
  const uint8_t* codes;
  Q5_0() = default;
  explicit Q5_0(const uint8_t* p)
      : d(load_halves(p)), qh(_mm512_loadu_si512(p + 32)), codes(p + 96) {}
  inline void pair(int j, __m512& lo, __m512& hi) const {
    const __m512i b = _mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + kLanes * j)));
    const __m512i nibble = _mm512_set1_epi32(0x0F), bit4 = _mm512_set1_epi32(0x10);
    const __m512i sixteen = _mm512_set1_epi32(16);
    // Bit j (and j + 16) of qh, moved to bit 4.
    const __m512i h_lo = _mm512_and_si512(
        j >= 4 ? _mm512_srl_epi32(qh, _mm_cvtsi32_si128(j - 4))
               : _mm512_sll_epi32(qh, _mm_cvtsi32_si128(4 - j)), bit4);
    const __m512i h_hi = _mm512_and_si512(_mm512_srl_epi32(qh, _mm_cvtsi32_si128(j + 12)), bit4);
    const __m512i q_lo = _mm512_sub_epi32(_mm512_or_si512(_mm512_and_si512(b, nibble), h_lo),
                                          sixteen);
    const __m512i q_hi = _mm512_sub_epi32(_mm512_or_si512(_mm512_srli_epi32(b, 4), h_hi),
                                          sixteen);
    lo = _mm512_mul_ps(_mm512_cvtepi32_ps(q_lo), d);
    hi = _mm512_mul_ps(_mm512_cvtepi32_ps(q_hi), d);
  }
};

// A Q4_K sub-block of 32, 384 bytes: s[16] fp32, m[16] fp32, codes[16][16] as Q4_1's.
// s = d * sc and m = -dmin * mn are exact in fp32 (11 + 6 significant bits, made at load), so
// is s * q; w = s * q + m in one FMA is the one rounding of the GGUF reference's d * q - dm.
struct Q4_K : ScaleMinNibbles {  // its s is the d of ScaleMinNibbles
  static constexpr int64_t kBytes = 384;
  Q4_K() = default;
  explicit Q4_K(const uint8_t* p)
      : ScaleMinNibbles(_mm512_loadu_ps(p), _mm512_loadu_ps(p + 64), p + 128) {}
};

// Two Q6_K sub-blocks of 16, 640 bytes: s0[16], s1[16] fp32 (weights 0-15, 16-31), then
// codes[32][16] int8 (q - 32) as Q8_0's. s = d * sc is exact in fp32 (11 + 7 significant
// bits), and so is s * q (+ 5 more): the GGUF reference's weight, with no rounding at all.
struct Q6_K {
  static constexpr int64_t kBytes = 640;
  __m512 s0, s1;
  const uint8_t* codes;
  Q6_K() = default;
  explicit Q6_K(const uint8_t* p)
      : s0(_mm512_loadu_ps(p)), s1(_mm512_loadu_ps(p + 64)), codes(p + 128) {}
  inline __m512 at(int k, __m512 s) const {
    return _mm512_mul_ps(int8s(codes, k), s);
  }
  inline void pair(int j, __m512& lo, __m512& hi) const {
    lo = at(j, s0);
    hi = at(j + 16, s1);
  }
};

// Block b of a group's codes, prefetching the one kAhead blocks on. Past the row's end that
// is the start of the next group, which the thread reads next (or memory past the tensor:
// a prefetch never faults).
template <class Format>
inline Format load_block(const uint8_t* group, int64_t b) {
  const uint8_t* p = group + b * Format::kBytes;
  for (int64_t line = 0; line < Format::kBytes; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p + kAhead * Format::kBytes + line),
                 _MM_HINT_T0);
  return Format(p);
}

// One tile: rows [0, MR) of x against NG groups starting at w.
//
// Sums run in two levels, as blocked BLAS sums do: each block's 32 products go into fresh
// registers, which are then added to running totals kept in L1. One chain over all K inputs
// (up to 1536) would lose several times more precision than the fp32 matmul does. With few
// accumulators, the weights k < 16 and k >= 16 of a block go to separate ones (S = 2), so
// that enough independent FMA chains are in flight to hide their latency.
template <class Format, int MR, int NG>
void tile(const float* x, int64_t K, const uint8_t* w, int64_t group_bytes, float* y,
          int64_t N, int64_t n0) {
  constexpr int S = MR * NG >= 8 ? 1 : 2;
  alignas(64) float total[MR][NG][kLanes] = {};
  const int64_t blocks = K / kBlock;
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * kBlock;
    Format blk[NG];
    for (int g = 0; g < NG; ++g) blk[g] = load_block<Format>(w + g * group_bytes, b);
    __m512 acc[MR][NG][S];
    for (int m = 0; m < MR; ++m)
      for (int g = 0; g < NG; ++g)
        for (int s = 0; s < S; ++s) acc[m][g][s] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int j = 0; j < 16; ++j) {
      for (int g = 0; g < NG; ++g) {
        __m512 lo, hi;
        blk[g].pair(j, lo, hi);
        for (int m = 0; m < MR; ++m) {
          acc[m][g][0] = _mm512_fmadd_ps(lo, _mm512_set1_ps(xb[m * K + j]), acc[m][g][0]);
          acc[m][g][S - 1] =
              _mm512_fmadd_ps(hi, _mm512_set1_ps(xb[m * K + j + 16]), acc[m][g][S - 1]);
        }
      }
    }
    for (int m = 0; m < MR; ++m)
      for (int g = 0; g < NG; ++g) {
        __m512 sum = acc[m][g][0];
        if constexpr (S == 2) sum = _mm512_add_ps(sum, acc[m][g][1]);
        _mm512_store_ps(total[m][g], _mm512_add_ps(_mm512_load_ps(total[m][g]), sum));
      }
  }
  for (int g = 0; g < NG; ++g) {
    const int64_t n = n0 + g * kLanes;
    const __mmask16 mask = n + kLanes <= N ? 0xFFFF : (__mmask16)((1u << (N - n)) - 1);
    for (int m = 0; m < MR; ++m)
      _mm512_mask_storeu_ps(y + m * N + n, mask, _mm512_load_ps(total[m][g]));
  }
}

constexpr int kMaxRows = 8;  // rows per tile
constexpr int kGroups = 2;   // groups per tile

template <class Format, int NG>
void rows_tile(int rows, const float* x, int64_t K, const uint8_t* w, int64_t group_bytes,
               float* y, int64_t N, int64_t n0) {
  switch (rows) {
    case 1: return tile<Format, 1, NG>(x, K, w, group_bytes, y, N, n0);
    case 2: return tile<Format, 2, NG>(x, K, w, group_bytes, y, N, n0);
    case 3: return tile<Format, 3, NG>(x, K, w, group_bytes, y, N, n0);
    case 4: return tile<Format, 4, NG>(x, K, w, group_bytes, y, N, n0);
    case 5: return tile<Format, 5, NG>(x, K, w, group_bytes, y, N, n0);
    case 6: return tile<Format, 6, NG>(x, K, w, group_bytes, y, N, n0);
    case 7: return tile<Format, 7, NG>(x, K, w, group_bytes, y, N, n0);
    default: return tile<Format, 8, NG>(x, K, w, group_bytes, y, N, n0);
  }
}

// Many rows (more than kMaxRows): the block's weights are dequantized once into a 2-4 KB
// buffer, then every tile of kMaxRows rows multiplies from it. Unpacking per row tile
// instead cost a quarter of the FMAs' time again at 30 rows.
template <int MR, int NG>
inline void rows_from_buffer(const float* wbuf, const float* xb, int64_t K, float* total) {
  __m512 acc[MR][NG];
  for (int m = 0; m < MR; ++m)
    for (int g = 0; g < NG; ++g) acc[m][g] = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int k = 0; k < kBlock; ++k)
    for (int g = 0; g < NG; ++g) {
      const __m512 wk = _mm512_load_ps(wbuf + (k * NG + g) * kLanes);
      for (int m = 0; m < MR; ++m)
        acc[m][g] = _mm512_fmadd_ps(wk, _mm512_set1_ps(xb[m * K + k]), acc[m][g]);
    }
  for (int m = 0; m < MR; ++m)
    for (int g = 0; g < NG; ++g) {
      float* t = total + (m * NG + g) * kLanes;
      _mm512_storeu_ps(t, _mm512_add_ps(_mm512_loadu_ps(t), acc[m][g]));
    }
}

template <int NG>
void rows_from_buffer(int rows, const float* wbuf, const float* xb, int64_t K, float* total) {
  switch (rows) {
    case 1: return rows_from_buffer<1, NG>(wbuf, xb, K, total);
    case 2: return rows_from_buffer<2, NG>(wbuf, xb, K, total);
    case 3: return rows_from_buffer<3, NG>(wbuf, xb, K, total);
    case 4: return rows_from_buffer<4, NG>(wbuf, xb, K, total);
    case 5: return rows_from_buffer<5, NG>(wbuf, xb, K, total);
    case 6: return rows_from_buffer<6, NG>(wbuf, xb, K, total);
    case 7: return rows_from_buffer<7, NG>(wbuf, xb, K, total);
    default: return rows_from_buffer<8, NG>(wbuf, xb, K, total);
  }
}

// All M rows of x against NG groups; total is the caller's scratch, M * NG * 16 floats.
template <class Format, int NG>
void tile_many_rows(int64_t M, const float* x, int64_t K, const uint8_t* w,
                    int64_t group_bytes, float* y, int64_t N, int64_t n0, float* total) {
  alignas(64) float wbuf[kBlock * NG * kLanes];
  std::fill(total, total + M * NG * kLanes, 0.0f);
  const int64_t blocks = K / kBlock;
  for (int64_t b = 0; b < blocks; ++b) {
    for (int g = 0; g < NG; ++g) {
      const Format blk = load_block<Format>(w + g * group_bytes, b);
      for (int j = 0; j < 16; ++j) {
        __m512 lo, hi;
        blk.pair(j, lo, hi);
        _mm512_store_ps(wbuf + (j * NG + g) * kLanes, lo);
        _mm512_store_ps(wbuf + ((j + 16) * NG + g) * kLanes, hi);
      }
    }
    for (int64_t m0 = 0; m0 < M; m0 += kMaxRows)
      rows_from_buffer<NG>(static_cast<int>(std::min<int64_t>(kMaxRows, M - m0)), wbuf,
                           x + m0 * K + b * kBlock, K, total + m0 * NG * kLanes);
  }
  for (int g = 0; g < NG; ++g) {
    const int64_t n = n0 + g * kLanes;
    const __mmask16 mask = n + kLanes <= N ? 0xFFFF : (__mmask16)((1u << (N - n)) - 1);
    for (int64_t m = 0; m < M; ++m)
      _mm512_mask_storeu_ps(y + m * N + n, mask, _mm512_loadu_ps(total + (m * NG + g) * kLanes));
  }
}

template <class Format>
torch::Tensor quantized_linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t N,
                               const char* name) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 2 && x.is_contiguous(), name,
              ": x must be a contiguous float32 [rows, in] tensor");
  TORCH_CHECK(packed.dtype() == torch::kUInt8 && packed.dim() == 3 && packed.is_contiguous() &&
                  packed.size(2) == Format::kBytes,
              name, ": packed weights must be contiguous uint8 [groups, blocks, ",
              Format::kBytes, "]");
  const int64_t M = x.size(0), K = x.size(1), groups = packed.size(0);
  TORCH_CHECK(K == packed.size(1) * kBlock, name, ": x has ", K, " inputs, weights ",
              packed.size(1) * kBlock);
  TORCH_CHECK(N > (groups - 1) * kLanes && N <= groups * kLanes, name, ": ", N,
              " outputs do not fit ", groups, " groups of 16 rows");
  auto y = torch::empty({M, N}, x.options());
  if (M == 0) return y;
  pybind11::gil_scoped_release no_gil;  // pure C++ from here on
  const float* xp = x.data_ptr<float>();
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  const int64_t group_bytes = packed.size(1) * Format::kBytes;
  const int64_t tiles = (groups + kGroups - 1) / kGroups;
  // Output groups are split between the threads; each thread runs all rows of x over its
  // groups, so its codes are read from memory once.
  // Each thread's running totals for the many-rows path, allocated here: nothing may throw
  // inside the OpenMP region.
  const int64_t scratch_size = M > kMaxRows ? M * kGroups * kLanes : 0;
  std::vector<float> scratch(omp_get_max_threads() * scratch_size);
#pragma omp parallel
  {
    float* total = scratch.data() + omp_get_thread_num() * scratch_size;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t g0 = t * kGroups;
      const int64_t n0 = g0 * kLanes;
      const uint8_t* w = wp + g0 * group_bytes;
      if (M > kMaxRows) {
        if (g0 + kGroups <= groups)
          tile_many_rows<Format, kGroups>(M, xp, K, w, group_bytes, yp, N, n0, total);
        else
          for (int64_t g = g0; g < groups; ++g)
            tile_many_rows<Format, 1>(M, xp, K, wp + g * group_bytes, group_bytes, yp, N,
                                      g * kLanes, total);
      } else if (g0 + kGroups <= groups) {
        rows_tile<Format, kGroups>(static_cast<int>(M), xp, K, w, group_bytes, yp, N, n0);
      } else {
        for (int64_t g = g0; g < groups; ++g)
          rows_tile<Format, 1>(static_cast<int>(M), xp, K, wp + g * group_bytes, group_bytes,
                               yp, N, g * kLanes);
      }
    }
  }
  return y;
}
}  // namespace

torch::Tensor q4_1_linear(torch::Tensor x, torch::Tensor packed, int64_t out_features) {
  return quantized_linear<Q4_1>(x, packed, out_features, "q4_1_linear");
}

torch::Tensor q8_0_linear(torch::Tensor x, torch::Tensor packed, int64_t out_features) {
  return quantized_linear<Q8_0>(x, packed, out_features, "q8_0_linear");
}

torch::Tensor q5_0_linear(torch::Tensor x, torch::Tensor packed, int64_t out_features) {
  return quantized_linear<Q5_0>(x, packed, out_features, "q5_0_linear");
}

torch::Tensor q4_k_linear(torch::Tensor x, torch::Tensor packed, int64_t out_features) {
  return quantized_linear<Q4_K>(x, packed, out_features, "q4_k_linear");
}

torch::Tensor q6_k_linear(torch::Tensor x, torch::Tensor packed, int64_t out_features) {
  return quantized_linear<Q6_K>(x, packed, out_features, "q6_k_linear");
}
