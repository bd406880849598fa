// The quantized matmul (quantized_linear_cpu.cpp explains the formats, the layout and the
// sums), written once over 16-lane vectors of fp32 (V) and int32 (VI). Each file that
// includes it first defines those types, the few operations below on them, and
//   kMaxRows  rows of x per register tile,
//   kGroups   output groups of 16 per tile,
//   kOneChain from how many accumulators per block (rows x groups) a single FMA chain per
//             accumulator hides the latency (below it, k < 16 and k >= 16 get a chain each),
// all for its own instruction set: quantized_linear_cpu.cpp for AVX-512 (one register per
// vector), quantized_linear_avx2.cpp for AVX2 (two). Include it inside a namespace of its own:
// its kernels have internal linkage, its entry points (q4_1 ... bf16) that namespace's name, so
// each file keeps the copy built for its target.
//
// Operations: vzero, vset1(float), vfmadd(a, b, c) = a * b + c, vmul, vadd, vload/vstore
// (unaligned), vstore_first(p, v, count) (lanes [0, count)), halves(p) (16 fp16 -> fp32),
// bf16s(p) (16 bfloat16 -> fp32), with_bit4(v, qh, i) (v with bit 4 set where bit i of qh is),
// u8s(p) / i8s(p) (16 bytes, zero- / sign-extended to int32), iset1, iand, ior, isub,
// isrli<n>, isrl(v, n) / isll(v, n) (every lane by n bits), iload(p) (16 int32), tofloat.
// No includes here (this text goes inside a namespace): include "kernel_api.h", <omp.h>,
// <immintrin.h>, <algorithm>, <vector> and "quantized_checks.h" before it.
#pragma once

namespace {

constexpr int64_t kLanes = 16;  // output rows per group
constexpr int64_t kBlock = 32;  // inputs per block
// Blocks to prefetch ahead of use. With the hardware prefetcher alone, each core streamed
// codes at ~9 GB/s and one row through 30 layers took 4.1 ms (2 threads, AVX-512); prefetching
// 2 to 8 blocks ahead brought that to ~2.4 ms, with no clear winner within the noise.
constexpr int64_t kAhead = 8;

// Code byte j of each of the group's 16 rows (16 bytes, row fastest) as fp32: its low nibble
// (weight j) and its high one (weight j + 16), for the 4-bit formats.
inline void nibbles(const uint8_t* codes, int j, V& lo, V& hi) {
  const VI b = u8s(codes + kLanes * j);
  lo = tofloat(iand(b, iset1(0x0F)));
  hi = tofloat(isrli<4>(b));
}

// Int8 code k of each of the group's 16 rows (16 bytes, row fastest) as fp32.
inline V int8s(const uint8_t* codes, int k) { return tofloat(i8s(codes + kLanes * k)); }

// Each format gives, for the group's 16 rows and a block of 32 inputs:
//   pair(j, lo, hi)   the weights k = j and k = j + 16, dequantized exactly (w = d * q + m);
//   codes(j, lo, hi)  the same weights' codes q alone, as fp32, and
//   lo_scale(), hi_scale(), min()  the d of each half (kTwoScales: they differ) and the m,
// so that a block's sum of products is d * sum(x q) + m * sum(x) (`tile`, few rows), or
// sum(x w) from the dequantized weights (`many_rows`). kScaled false: the codes are the
// weights (F16, BF16); kHasMin false: m = 0.

// The 5-bit codes of weights j and j + 16 of the group's 16 rows, as fp32: the low four bits as
// `nibbles` reads them, the fifth from bit j (and j + 16) of each row's word qh (Q5_0, Q5_K).
inline void fifth_bit_codes(const uint8_t* codes, VI qh, int j, V& lo, V& hi) {
  const VI b = u8s(codes + kLanes * j);
  lo = tofloat(with_bit4(iand(b, iset1(0x0F)), qh, j));
  hi = tofloat(with_bit4(isrli<4>(b), qh, j + 16));
}

// The 4-bit formats with a scale and a min per row: w = d * q + m in one FMA, q a code of
// `nibbles`. Q4_1 and Q4_K are this, loaded from their own bytes.
struct ScaleMinNibbles {
  static constexpr bool kScaled = true, kTwoScales = false, kHasMin = true;
  static constexpr int64_t kUnit = 1;  // blocks of 32 per stored unit
  V d, m;
  const uint8_t* codes_;
  ScaleMinNibbles() = default;
  ScaleMinNibbles(V d_, V m_, const uint8_t* codes) : d(d_), m(m_), codes_(codes) {}
  inline void codes(int j, V& lo, V& hi) const { nibbles(codes_, j, lo, hi); }
  inline void pair(int j, V& lo, V& hi) const {
    codes(j, lo, hi);
    lo = vfmadd(lo, d, m);
    hi = vfmadd(hi, d, m);
  }
  inline V lo_scale() const { return d; }
  inline V hi_scale() const { return d; }
  inline V min() const { return m; }
};

struct Q4_1 : ScaleMinNibbles {
  static constexpr int64_t kBytes = 320;
  Q4_1() = default;
  explicit Q4_1(const uint8_t* p) : ScaleMinNibbles(halves(p), halves(p + 32), p + 64) {}
};

struct Q8_0 {
  static constexpr int64_t kBytes = 544;
  static constexpr int64_t kUnit = 1;
  static constexpr bool kScaled = true, kTwoScales = false, kHasMin = false;
  V d;
  const uint8_t* codes_;
  Q8_0() = default;
  explicit Q8_0(const uint8_t* p) : d(halves(p)), codes_(p + 32) {}
  inline void codes(int j, V& lo, V& hi) const {
    lo = int8s(codes_, j);
    hi = int8s(codes_, j + 16);
  }
  inline void pair(int j, V& lo, V& hi) const {
    codes(j, lo, hi);
    lo = vmul(lo, d);
    hi = vmul(hi, d);
  }
  inline V lo_scale() const { return d; }
  inline V hi_scale() const { return d; }
  inline V min() const { return vzero(); }
};

// Q5_0, 352 bytes: d[16] fp16, qh[16] uint32 (bit i: weight i's fifth bit), codes[16][16] as
// Q4_1's. w = d * (q - 16): exact in fp32 (11 + 5 significant bits), as the GGUF reference.
struct Q5_0 {
  static constexpr int64_t kBytes = 352;
  static constexpr int64_t kUnit = 1;
  static constexpr bool kScaled = true, kTwoScales = false, kHasMin = true;
  V d;
  VI qh;
  const uint8_t* codes_;
  Q5_0() = default;
  explicit Q5_0(const uint8_t* p) : d(halves(p)), qh(iload(p + 32)), codes_(p + 96) {}
  // q + 16 (0..31): the four low bits and the fifth.
  inline void codes(int j, V& lo, V& hi) const {
    fifth_bit_codes(codes_, qh, j, lo, hi);
  }
  inline void pair(int j, V& lo, V& hi) const {
    codes(j, lo, hi);
    lo = vmul(vadd(lo, vset1(-16.0f)), d);  // q - 16 is exact, and so is its product
    hi = vmul(vadd(hi, vset1(-16.0f)), d);
  }
  inline V lo_scale() const { return d; }
  inline V hi_scale() const { return d; }
  inline V min() const { return vmul(d, vset1(-16.0f)); }  // exact
};

// Q4_K as the file has it, 2,368 bytes per super-block of 256 weights (8 blocks of 32):
// d[16] and dmin[16] fp16, sc[8][16] and mn[8][16] (the 6-bit sub-scales and sub-mins as
// bytes), codes[8][16][16] as Q4_1's. Block `sub` has s = d * sc and m = -dmin * mn, both exact
// in fp32 (11 + 6 significant bits), so w = s * q + m is the GGUF reference's one rounding.
struct Q4_K : ScaleMinNibbles {
  static constexpr int64_t kBytes = 2368, kUnit = 8;
  Q4_K() = default;
  Q4_K(const uint8_t* p, int64_t sub)
      : ScaleMinNibbles(vmul(halves(p), tofloat(u8s(p + 64 + kLanes * sub))),
                        vmul(halves(p + 32), tofloat(isub(iset1(0), u8s(p + 192 + kLanes * sub)))),
                        p + 320 + 256 * sub) {}
};

// Q6_K as the file has it, 3,360 bytes per super-block of 256 weights: d[16] fp16,
// sc[16][16] int8 (a sub-scale per 16 weights), then per block of 32 the low four bits of
// each weight as Q4_1's code bytes (ql[8][16][16]) and the two high bits four to a byte
// (qh[8][8][16]: byte j holds weights j, j + 8, j + 16, j + 24 at bits 0, 2, 4, 6). The code
// q is 0..63, the weight (q - 32) * d * sc: d * sc is exact in fp32 (11 + 7 significant
// bits), and so is its product with q - 32 (+ 6): the GGUF reference's weight, no rounding.
struct Q6_K {
  static constexpr int64_t kBytes = 3360, kUnit = 8;
  static constexpr bool kScaled = true, kTwoScales = true, kHasMin = false;
  V s0, s1;
  const uint8_t* ql;
  const uint8_t* qh;
  Q6_K() = default;
  Q6_K(const uint8_t* p, int64_t sub)
      : s0(vmul(halves(p), tofloat(i8s(p + 32 + kLanes * (2 * sub))))),
        s1(vmul(halves(p), tofloat(i8s(p + 32 + kLanes * (2 * sub + 1))))),
        ql(p + 288 + 256 * sub), qh(p + 2336 + 128 * sub) {}
  inline void codes(int j, V& lo, V& hi) const {
    const VI b = u8s(ql + kLanes * j);
    const VI h = u8s(qh + kLanes * (j & 7));
    const int shift = 2 * (j >> 3);  // weight j's two bits; weight j + 16's are 4 above
    const VI thirty_two = iset1(32), top = iset1(0x30);
    const VI h_lo = shift == 0 ? isll(h, 4) : isll(h, 2);
    const VI h_hi = shift == 0 ? h : isrl(h, 2);
    lo = tofloat(isub(ior(iand(b, iset1(0x0F)), iand(h_lo, top)), thirty_two));
    hi = tofloat(isub(ior(isrli<4>(b), iand(h_hi, top)), thirty_two));
  }
  inline void pair(int j, V& lo, V& hi) const {
    codes(j, lo, hi);
    lo = vmul(lo, s0);
    hi = vmul(hi, s1);
  }
  inline V lo_scale() const { return s0; }
  inline V hi_scale() const { return s1; }
  inline V min() const { return vzero(); }
};


// A Q5_K sub-block of 32 (and Q5_1's block), 448 bytes: s[16] fp32, m[16] fp32, qh[16] uint32
// (bit i: weight i's fifth bit, as Q5_0's), codes[16][16] as Q4_1's. s = d * sc and
// m = -dmin * mn are exact in fp32 (made at load; Q5_1's d and m are fp16), so is s * q
// (+ 5 bits); w = s * q + m in one FMA is the GGUF reference's one rounding.
struct Q5_K {
  static constexpr int64_t kBytes = 448;
  static constexpr int64_t kUnit = 1;
  static constexpr bool kScaled = true, kTwoScales = false, kHasMin = true;
  V s, m;
  VI qh;
  const uint8_t* codes_;
  Q5_K() = default;
  explicit Q5_K(const uint8_t* p)
      : s(vload(reinterpret_cast<const float*>(p))),
        m(vload(reinterpret_cast<const float*>(p + 64))), qh(iload(p + 128)), codes_(p + 192) {}
  inline void codes(int j, V& lo, V& hi) const {
    fifth_bit_codes(codes_, qh, j, lo, hi);
  }
  inline void pair(int j, V& lo, V& hi) const {
    codes(j, lo, hi);
    lo = vfmadd(lo, s, m);
    hi = vfmadd(hi, s, m);
  }
  inline V lo_scale() const { return s; }
  inline V hi_scale() const { return s; }
  inline V min() const { return m; }
};

// 16-bit floats as they are, 1024 bytes: w[32][16], fp16 (F16) or bfloat16 (BF16); both
// widen to fp32 exactly.
struct F16 {
  static constexpr int64_t kBytes = 1024;
  static constexpr int64_t kUnit = 1;
  static constexpr bool kScaled = false, kTwoScales = false, kHasMin = false;
  const uint8_t* w;
  F16() = default;
  explicit F16(const uint8_t* p) : w(p) {}
  inline void codes(int j, V& lo, V& hi) const {
    lo = halves(w + 2 * kLanes * j);
    hi = halves(w + 2 * kLanes * (j + 16));
  }
  inline void pair(int j, V& lo, V& hi) const { codes(j, lo, hi); }
  inline V lo_scale() const { return vset1(1.0f); }
  inline V hi_scale() const { return vset1(1.0f); }
  inline V min() const { return vzero(); }
};

struct BF16 {
  static constexpr int64_t kBytes = 1024;
  static constexpr int64_t kUnit = 1;
  static constexpr bool kScaled = false, kTwoScales = false, kHasMin = false;
  const uint8_t* w;
  BF16() = default;
  explicit BF16(const uint8_t* p) : w(p) {}
  inline void codes(int j, V& lo, V& hi) const {
    lo = bf16s(w + 2 * kLanes * j);
    hi = bf16s(w + 2 * kLanes * (j + 16));
  }
  inline void pair(int j, V& lo, V& hi) const { codes(j, lo, hi); }
  inline V lo_scale() const { return vset1(1.0f); }
  inline V hi_scale() const { return vset1(1.0f); }
  inline V min() const { return vzero(); }
};

// Block b of a group's codes, prefetching about kAhead blocks on. Past the row's end that
// is the start of the next group, which the thread reads next (or memory past the tensor:
// a prefetch never faults). A format stored in units of several blocks (the K-quants'
// super-blocks) finds block b's unit and its place in it.
template <class Format>
inline Format load_block(const uint8_t* group, int64_t b) {
  constexpr int64_t per_block = Format::kBytes / Format::kUnit;
  const uint8_t* ahead = group + (b + kAhead) * per_block;
  for (int64_t line = 0; line < per_block; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(ahead + line), _MM_HINT_T0);
  if constexpr (Format::kUnit == 1) {
    return Format(group + b * Format::kBytes);
  } else {
    return Format(group + b / Format::kUnit * Format::kBytes, b % Format::kUnit);
  }
}

// The first `valid` outputs of a group's 16, for each of `rows` rows of totals (`stride`
// floats apart), into y (rows N apart) from column n.
inline void store_group(const float* totals, int64_t stride, int64_t rows, float* y, int64_t N,
                        int64_t n) {
  const int64_t valid = std::min<int64_t>(kLanes, N - n);
  for (int64_t m = 0; m < rows; ++m) vstore_first(y + m * N + n, vload(totals + m * stride), valid);
}

// One tile: rows [0, MR) of x against NG groups starting at w.
//
// Sums run in two levels, as blocked BLAS sums do: each block's 32 products of x and the
// codes go into fresh registers, which are then scaled (d * sum + m * sum(x), the block's
// sum of x from `xsum`) and added to running totals kept in L1. One chain over all K inputs
// (up to 1536) would lose several times more precision than the fp32 matmul does. With few
// accumulators, the weights k < 16 and k >= 16 of a block go to separate ones (S = 2), so
// that enough independent FMA chains are in flight to hide their latency (and always where
// the halves have scales of their own). Scaling once a block instead of once a weight saves
// a multiply (or FMA) per weight: at one row the step is as much arithmetic as memory.
template <class Format, int MR, int NG>
void tile(const float* x, int64_t K, const uint8_t* w, int64_t group_bytes, float* y,
          int64_t N, int64_t n0, const float* xsum) {
  constexpr int S = MR * NG >= kOneChain && !Format::kTwoScales ? 1 : 2;
  alignas(64) float total[MR][NG][kLanes] = {};
  const int64_t blocks = K / kBlock;
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * kBlock;
    Format blk[NG];
    for (int g = 0; g < NG; ++g) blk[g] = load_block<Format>(w + g * group_bytes, b);
    V acc[MR][NG][S];
    for (int m = 0; m < MR; ++m)
      for (int g = 0; g < NG; ++g)
        for (int s = 0; s < S; ++s) acc[m][g][s] = vzero();
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) {
      for (int g = 0; g < NG; ++g) {
        V lo, hi;
        blk[g].codes(j, lo, hi);
        for (int m = 0; m < MR; ++m) {
          acc[m][g][0] = vfmadd(lo, vset1(xb[m * K + j]), acc[m][g][0]);
          acc[m][g][S - 1] = vfmadd(hi, vset1(xb[m * K + j + 16]), acc[m][g][S - 1]);
        }
      }
    }
    for (int m = 0; m < MR; ++m)
      for (int g = 0; g < NG; ++g) {
        V t = vload(total[m][g]);
        if constexpr (!Format::kScaled) {
          t = vadd(t, acc[m][g][0]);
          if constexpr (S == 2) t = vadd(t, acc[m][g][1]);
        } else if constexpr (S == 2) {
          t = vfmadd(acc[m][g][0], blk[g].lo_scale(), t);
          t = vfmadd(acc[m][g][1], blk[g].hi_scale(), t);
        } else {
          t = vfmadd(acc[m][g][0], blk[g].lo_scale(), t);
        }
        if constexpr (Format::kHasMin) t = vfmadd(blk[g].min(), vset1(xsum[m * blocks + b]), t);
        vstore(total[m][g], t);
      }
  }
  for (int g = 0; g < NG; ++g)
    store_group(&total[0][g][0], NG * kLanes, MR, y, N, n0 + g * kLanes);
}

template <class Format, int NG, int MR = kMaxRows>
void rows_tile(int rows, const float* x, int64_t K, const uint8_t* w, int64_t group_bytes,
               float* y, int64_t N, int64_t n0, const float* xsum) {
  if constexpr (MR > 1) {
    if (rows < MR)
      return rows_tile<Format, NG, MR - 1>(rows, x, K, w, group_bytes, y, N, n0, xsum);
  }
  tile<Format, MR, NG>(x, K, w, group_bytes, y, N, n0, xsum);
}

// Each row's sum of x over each block of 32 inputs, [M][K / 32], for the formats with a min.
inline std::vector<float> block_sums(const float* x, int64_t M, int64_t K) {
  std::vector<float> sums(M * (K / kBlock));
  for (int64_t i = 0; i < M * (K / kBlock); ++i) {
    const float* xb = x + i * kBlock;
    float s = 0.0f;
    for (int k = 0; k < kBlock; ++k) s += xb[k];
    sums[i] = s;
  }
  return sums;
}

// Many rows (more than kMaxRows): each block's weights are dequantized once into a 2-4 KB
// buffer, then every tile of kMaxRows rows multiplies from it. Unpacking per row tile
// instead cost a quarter of the FMAs' time again at 30 rows (AVX-512). Up to kPanelRows rows
// every row walks a block before the next block (`tile_many_rows`: the block in L1, each
// row's totals added to once per block); with more, each row tile walks every block before
// the next row tile (`tile_from_panel`: the tile's K x NG x 16 weights dequantized once into
// a buffer in L2, each row tile's totals in L1, x read row by row instead of as a column of
// every row's 32 values per block). The sums are the same either way.
template <int MR, int NG>
inline void buffer_tile(const float* wbuf, const float* xb, int64_t K, float* total) {
  V acc[MR][NG];
  for (int m = 0; m < MR; ++m)
    for (int g = 0; g < NG; ++g) acc[m][g] = vzero();
#pragma GCC unroll 4
  for (int k = 0; k < kBlock; ++k)
    for (int g = 0; g < NG; ++g) {
      const V wk = vload(wbuf + (k * NG + g) * kLanes);
      for (int m = 0; m < MR; ++m) acc[m][g] = vfmadd(wk, vset1(xb[m * K + k]), acc[m][g]);
    }
  for (int m = 0; m < MR; ++m)
    for (int g = 0; g < NG; ++g) {
      float* t = total + (m * NG + g) * kLanes;
      vstore(t, vadd(vload(t), acc[m][g]));
    }
}

template <int NG, int MR = kMaxRows>
void rows_from_buffer(int rows, const float* wbuf, const float* xb, int64_t K, float* total) {
  if constexpr (MR > 1) {
    if (rows < MR) return rows_from_buffer<NG, MR - 1>(rows, wbuf, xb, K, total);
  }
  buffer_tile<MR, NG>(wbuf, xb, K, total);
}

// Block b of NG groups' codes as fp32 weights, [32][NG][16]: input k's weights of the NG x 16
// outputs side by side.
template <class Format, int NG>
inline void dequantize_block(const uint8_t* w, int64_t group_bytes, int64_t b, float* out) {
  for (int g = 0; g < NG; ++g) {
    const Format blk = load_block<Format>(w + g * group_bytes, b);
    for (int j = 0; j < 16; ++j) {
      V lo, hi;
      blk.pair(j, lo, hi);
      vstore(out + (j * NG + g) * kLanes, lo);
      vstore(out + ((j + 16) * NG + g) * kLanes, hi);
    }
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
    dequantize_block<Format, NG>(w, group_bytes, b, wbuf);
    for (int64_t m0 = 0; m0 < M; m0 += kMaxRows)
      rows_from_buffer<NG>(static_cast<int>(std::min<int64_t>(kMaxRows, M - m0)), wbuf,
                           x + m0 * K + b * kBlock, K, total + m0 * NG * kLanes);
  }
  for (int g = 0; g < NG; ++g)
    store_group(total + g * kLanes, NG * kLanes, M, y, N, n0 + g * kLanes);
}

// From this many rows on, the panel order: on an Intel Xeon, family 6 model 167, all the
// model's layers in q4_1 at 512 rows took 342-358 ms against 400-427 in the block order, at
// 128 rows 91-93 against 96-100; a build taking it for every row count was slower at 16 rows
// (benchmarks/studies/quantized_microbench.py; docs/quantized.md, Prefill chunks).
constexpr int64_t kPanelRows = 65;

// MR rows of x (MR <= kMaxRows) over every block of a dequantized panel, into y.
template <int NG, int MR = kMaxRows>
void rows_from_panel(int rows, const float* panel, const float* x, int64_t K, float* y,
                     int64_t N, int64_t n0) {
  if constexpr (MR > 1) {
    if (rows < MR) return rows_from_panel<NG, MR - 1>(rows, panel, x, K, y, N, n0);
  }
  alignas(64) float total[MR * NG * kLanes] = {};
  for (int64_t b = 0; b < K / kBlock; ++b)
    buffer_tile<MR, NG>(panel + b * kBlock * NG * kLanes, x + b * kBlock, K, total);
  for (int g = 0; g < NG; ++g)
    store_group(total + g * kLanes, NG * kLanes, MR, y, N, n0 + g * kLanes);
}

// All M rows of x against NG groups, a row tile at a time over the whole dequantized panel;
// panel is the caller's scratch, K * NG * 16 floats.
template <class Format, int NG>
void tile_from_panel(int64_t M, const float* x, int64_t K, const uint8_t* w,
                     int64_t group_bytes, float* y, int64_t N, int64_t n0, float* panel) {
  for (int64_t b = 0; b < K / kBlock; ++b)
    dequantize_block<Format, NG>(w, group_bytes, b, panel + b * kBlock * NG * kLanes);
  for (int64_t m0 = 0; m0 < M; m0 += kMaxRows)
    rows_from_panel<NG>(static_cast<int>(std::min<int64_t>(kMaxRows, M - m0)), panel,
                        x + m0 * K, K, y + m0 * N, N, n0);
}

// More than kMaxRows rows, in the order that suits their count; scratch as either needs.
template <class Format, int NG>
void many_rows(int64_t M, const float* x, int64_t K, const uint8_t* w, int64_t group_bytes,
               float* y, int64_t N, int64_t n0, float* scratch) {
  if (M >= kPanelRows)
    tile_from_panel<Format, NG>(M, x, K, w, group_bytes, y, N, n0, scratch);
  else
    tile_many_rows<Format, NG>(M, x, K, w, group_bytes, y, N, n0, scratch);
}

template <class Format>
at::Tensor quantized_linear(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                            const char* name) {
  TORCH_CHECK(x.dtype() == at::kFloat && x.dim() == 2 && x.is_contiguous(), name,
              ": x must be a contiguous float32 [rows, in] tensor");
  quantized_checks::check_packed(x, packed, N, Format::kBytes, name, 32 * Format::kUnit);
  const int64_t M = x.size(0), K = x.size(1), groups = packed.size(0);
  auto y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  const float* xp = x.data_ptr<float>();
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  const int64_t group_bytes = packed.size(1) * Format::kBytes;
  const int64_t tiles = (groups + kGroups - 1) / kGroups;
  // Output groups are split between the threads; each thread runs all rows of x over its
  // groups, so its codes are read from memory once.
  // Each thread's scratch for the many-rows paths (all rows' running totals, or a dequantized
  // panel), allocated here: nothing may throw inside the OpenMP region.
  const int64_t scratch_size =
      M <= kMaxRows ? 0 : (M >= kPanelRows ? K : M) * kGroups * kLanes;
  std::vector<float> scratch(omp_get_max_threads() * scratch_size);
  const std::vector<float> sums =
      Format::kHasMin && M <= kMaxRows ? block_sums(xp, M, K) : std::vector<float>();
#pragma omp parallel
  {
    float* mine = scratch.data() + omp_get_thread_num() * scratch_size;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t g0 = t * kGroups;
      const int64_t n0 = g0 * kLanes;
      const uint8_t* w = wp + g0 * group_bytes;
      if (M > kMaxRows) {
        if (g0 + kGroups <= groups)
          many_rows<Format, kGroups>(M, xp, K, w, group_bytes, yp, N, n0, mine);
        else
          for (int64_t g = g0; g < groups; ++g)
            many_rows<Format, 1>(M, xp, K, wp + g * group_bytes, group_bytes, yp, N,
                                 g * kLanes, mine);
      } else if (g0 + kGroups <= groups) {
        rows_tile<Format, kGroups>(static_cast<int>(M), xp, K, w, group_bytes, yp, N, n0,
                                   sums.data());
      } else {
        for (int64_t g = g0; g < groups; ++g)
          rows_tile<Format, 1>(static_cast<int>(M), xp, K, wp + g * group_bytes, group_bytes,
                               yp, N, g * kLanes, sums.data());
      }
    }
  }
  return y;
}

}  // namespace

// The entry points of this instruction set's copy (declared by whoever dispatches to it).
at::Tensor q4_1(const at::Tensor& x, const at::Tensor& packed, int64_t n) {
  return quantized_linear<Q4_1>(x, packed, n, "q4_1_linear");
}
at::Tensor q8_0(const at::Tensor& x, const at::Tensor& packed, int64_t n) {
  return quantized_linear<Q8_0>(x, packed, n, "q8_0_linear");
}
at::Tensor q5_0(const at::Tensor& x, const at::Tensor& packed, int64_t n) {
  return quantized_linear<Q5_0>(x, packed, n, "q5_0_linear");
}
at::Tensor q4_k(const at::Tensor& x, const at::Tensor& packed, int64_t n) {
  return quantized_linear<Q4_K>(x, packed, n, "q4_k_linear");
}
at::Tensor q6_k(const at::Tensor& x, const at::Tensor& packed, int64_t n) {
  return quantized_linear<Q6_K>(x, packed, n, "q6_k_linear");
}
at::Tensor q5_k(const at::Tensor& x, const at::Tensor& packed, int64_t n) {
  return quantized_linear<Q5_K>(x, packed, n, "q5_k_linear");
}
at::Tensor f16(const at::Tensor& x, const at::Tensor& packed, int64_t n) {
  return quantized_linear<F16>(x, packed, n, "f16_linear");
}
at::Tensor bf16(const at::Tensor& x, const at::Tensor& packed, int64_t n) {
  return quantized_linear<BF16>(x, packed, n, "bf16_linear");
}
