// y[M, N] = x[M, K] @ W for a few rows (a decode step), with W packed once at load
// (CPU, AVX-512; fp32, or bf16 with fp32 accumulation through AVX512_BF16).
//
// Packed layout. W is cut into column panels of NB = 16 * NR outputs (the last one zero
// padded). A panel is stored K-major, so streaming through it is one sequential read:
//   fp32: [panels, K, NB]          panel p, row k holds W[k, p*NB : (p+1)*NB]
//   bf16: [panels, K2/2, NB, 2]    K2 = K rounded up to even (zero row); pair (k, k+1) of
//                                  each column side by side, the operand order of
//                                  vdpbf16ps (one 512-bit load = 16 columns x 2 k)
//
// Work split. The panels are cut into one contiguous range per thread, so each core
// streams its own part of W from memory (the step is memory-bound at one row). Within a
// panel, the M rows are cut into row blocks of at most MR rows; a micro-kernel keeps an
// MR x NR block of 16-float accumulators in registers for the whole K loop, so each
// weight vector loaded is used by every row of the block (30 rows cost a few passes over
// a panel, the later ones from L2, not 30). Only the first row block prefetches ahead in
// the weight stream; the others find the panel in cache.
//
// Arithmetic. fp32: one FMA per multiply-add, in k order per output (exact fp32, summed
// in a different order from MKL). bf16: vdpbf16ps adds two exact bf16 x bf16 products to
// an fp32 accumulator per step; the sum is rounded to bf16 once, at the end
// (round-to-nearest-even, as torch's bf16 matmul does).
#include <torch/extension.h>

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

// Bytes ahead of the current weight row that the first row block prefetches (0 = none).
int64_t g_prefetch_bytes = 1024;

inline __mmask16 tail_mask(int64_t valid) {
  return valid >= 16 ? static_cast<__mmask16>(0xFFFF)
                     : static_cast<__mmask16>((1u << std::max<int64_t>(valid, 0)) - 1u);
}

inline void prefetch_row(const char* row, int64_t bytes, int64_t distance) {
  for (int64_t off = 0; off < bytes; off += 64)
    _mm_prefetch(row + distance + off, _MM_HINT_T0);
}

// ---- fp32 ----------------------------------------------------------------------------
// rows x NR vectors of y for one panel: y[r, c] = sum_k x[r, k] * panel[k, c].
template <int MR, int NR>
void tile_f32(const float* x, int64_t ldx, const float* panel, int64_t K, float* y,
              int64_t ldy, int64_t valid_cols, int64_t prefetch) {
  constexpr int64_t NB = 16 * NR;
  __m512 acc[MR][NR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();

  const float* w = panel;
  if (prefetch > 0) {
    for (int64_t k = 0; k < K; ++k, w += NB) {
      prefetch_row(reinterpret_cast<const char*>(w), NB * 4, prefetch);
      __m512 b[NR];
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) b[j] = _mm512_load_ps(w + 16 * j);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const __m512 a = _mm512_set1_ps(x[i * ldx + k]);
#pragma GCC unroll 16
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(a, b[j], acc[i][j]);
      }
    }
  } else {
#pragma GCC unroll 2
    for (int64_t k = 0; k < K; ++k, w += NB) {
      __m512 b[NR];
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) b[j] = _mm512_load_ps(w + 16 * j);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const __m512 a = _mm512_set1_ps(x[i * ldx + k]);
#pragma GCC unroll 16
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(a, b[j], acc[i][j]);
      }
    }
  }

#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) {
      const int64_t valid = valid_cols - 16 * j;
      if (valid >= 16)
        _mm512_storeu_ps(y + i * ldy + 16 * j, acc[i][j]);
      else if (valid > 0)
        _mm512_mask_storeu_ps(y + i * ldy + 16 * j, tail_mask(valid), acc[i][j]);
    }
}

// ---- bf16 ----------------------------------------------------------------------------
inline __m512i broadcast_pair(const c10::BFloat16* p) {
  int32_t bits;
  std::memcpy(&bits, p, sizeof(bits));
  return _mm512_set1_epi32(bits);
}

template <int MR, int NR>
void tile_bf16(const c10::BFloat16* x, int64_t ldx, const c10::BFloat16* panel, int64_t K2,
               c10::BFloat16* y, int64_t ldy, int64_t valid_cols, int64_t prefetch) {
  constexpr int64_t NB = 16 * NR;  // columns; a k pair of a panel is 2 * NB bf16
  __m512 acc[MR][NR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();

  const c10::BFloat16* w = panel;
  const int64_t pairs = K2 / 2;
  if (prefetch > 0) {
    for (int64_t kp = 0; kp < pairs; ++kp, w += 2 * NB) {
      prefetch_row(reinterpret_cast<const char*>(w), NB * 4, prefetch);
      __m512i b[NR];
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) b[j] = _mm512_load_si512(w + 32 * j);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const __m512i a = broadcast_pair(x + i * ldx + 2 * kp);
#pragma GCC unroll 16
        for (int j = 0; j < NR; ++j)
          acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)a, (__m512bh)b[j]);
      }
    }
  } else {
#pragma GCC unroll 2
    for (int64_t kp = 0; kp < pairs; ++kp, w += 2 * NB) {
      __m512i b[NR];
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) b[j] = _mm512_load_si512(w + 32 * j);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const __m512i a = broadcast_pair(x + i * ldx + 2 * kp);
#pragma GCC unroll 16
        for (int j = 0; j < NR; ++j)
          acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)a, (__m512bh)b[j]);
      }
    }
  }

#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
    for (int j = 0; j < NR; ++j) {
      const int64_t valid = valid_cols - 16 * j;
      const __m256i packed = (__m256i)_mm512_cvtneps_pbh(acc[i][j]);  // round to nearest even
      if (valid >= 16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i * ldy + 16 * j), packed);
      else if (valid > 0)
        _mm256_mask_storeu_epi16(y + i * ldy + 16 * j, tail_mask(valid), packed);
    }
}

// ---- dispatch ------------------------------------------------------------------------
template <typename T>
using TileFn = void (*)(const T*, int64_t, const T*, int64_t, T*, int64_t, int64_t, int64_t);

template <typename T, int MR, int NR>
constexpr TileFn<T> tile_for() {
  if constexpr (std::is_same_v<T, float>)
    return &tile_f32<MR, NR>;
  else
    return &tile_bf16<MR, NR>;
}

// Largest row block per panel width: MR * NR accumulators plus NR weight vectors must fit
// the 32 vector registers.
template <int NR>
constexpr int max_rows() {
  return NR == 1 ? 12 : NR == 2 ? 12 : NR == 3 ? 8 : 6;
}

template <typename T, int NR, int... Rows>
constexpr auto make_table(std::integer_sequence<int, Rows...>) {
  return std::array<TileFn<T>, sizeof...(Rows)>{tile_for<T, Rows + 1, NR>()...};
}

template <typename T, int NR>
void run(const T* x, int64_t M, int64_t K, const T* packed, int64_t panels, int64_t panel_stride,
         int64_t N, T* y, int nthreads) {
  constexpr int64_t NB = 16 * NR;
  constexpr int MRmax = max_rows<NR>();
  static constexpr auto table = make_table<T, NR>(std::make_integer_sequence<int, MRmax>{});
  // Row blocks of near-equal size (8 rows -> 4 + 4, not 6 + 2).
  const int64_t blocks = (M + MRmax - 1) / MRmax;
  const int64_t base = M / blocks, extra = M % blocks;
  const int64_t prefetch = g_prefetch_bytes;

#pragma omp parallel num_threads(nthreads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t p0 = panels * t / nt, p1 = panels * (t + 1) / nt;
    for (int64_t p = p0; p < p1; ++p) {
      const T* panel = packed + p * panel_stride;
      const int64_t valid = std::min<int64_t>(NB, N - p * NB);
      int64_t row = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t rows = base + (b < extra ? 1 : 0);
        table[rows - 1](x + row * K, K, panel, K, y + row * N + p * NB, N, valid,
                        b == 0 ? prefetch : 0);
        row += rows;
      }
    }
  }
}

}  // namespace

// x: [M, K] contiguous; packed: the layout above; n: true output count. Returns y [M, n].
torch::Tensor dense_linear(torch::Tensor x, torch::Tensor packed, int64_t n, int64_t threads) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && packed.is_contiguous(),
              "dense_linear: x [M, K] and the packed weight must be contiguous");
  TORCH_CHECK(x.dtype() == packed.dtype() &&
                  (x.dtype() == torch::kFloat32 || x.dtype() == torch::kBFloat16),
              "dense_linear: x and the packed weight both float32 or both bfloat16");
  const bool bf16 = x.dtype() == torch::kBFloat16;
  TORCH_CHECK(packed.dim() == (bf16 ? 4 : 3), "dense_linear: packed weight of the wrong rank");
  const int64_t M = x.size(0), K = x.size(1), panels = packed.size(0);
  const int64_t NB = packed.size(2);
  TORCH_CHECK(NB == 16 || NB == 32 || NB == 48 || NB == 64,
              "dense_linear: panel width must be 16, 32, 48 or 64");
  TORCH_CHECK(n > 0 && n <= panels * NB && n > (panels - 1) * NB,
              "dense_linear: n does not match the packed panels");
  if (bf16) {
    TORCH_CHECK(packed.size(3) == 2 && packed.size(1) * 2 == K + (K & 1),
                "dense_linear: bf16 packed weight is [panels, ceil(K/2), NB, 2]");
  } else {
    TORCH_CHECK(packed.size(1) == K, "dense_linear: packed weight is [panels, K, NB]");
  }
  TORCH_CHECK(M >= 1, "dense_linear: at least one row");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(packed.data_ptr()) % 64 == 0,
              "dense_linear: packed weight must be 64-byte aligned");

  // An odd K in bf16: pad x with a zero column so k pairs never read past a row.
  torch::Tensor xin = (bf16 && (K & 1)) ? torch::constant_pad_nd(x, {0, 1}) : x;
  const int64_t K2 = xin.size(1);
  auto y = torch::empty({M, n}, x.options());
  const int nthreads = static_cast<int>(std::max<int64_t>(1, threads));

  // Pure C++ from here on (every check done above: nothing may throw inside OpenMP).
  pybind11::gil_scoped_release no_gil;
  if (bf16) {
    using B = c10::BFloat16;
    const B* xp = xin.data_ptr<B>();
    const B* wp = packed.data_ptr<B>();
    B* yp = y.data_ptr<B>();
    const int64_t stride = K2 * NB;
    switch (NB) {
      case 16: run<B, 1>(xp, M, K2, wp, panels, stride, n, yp, nthreads); break;
      case 32: run<B, 2>(xp, M, K2, wp, panels, stride, n, yp, nthreads); break;
      case 48: run<B, 3>(xp, M, K2, wp, panels, stride, n, yp, nthreads); break;
      default: run<B, 4>(xp, M, K2, wp, panels, stride, n, yp, nthreads); break;
    }
  } else {
    const float* xp = xin.data_ptr<float>();
    const float* wp = packed.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const int64_t stride = K * NB;
    switch (NB) {
      case 16: run<float, 1>(xp, M, K, wp, panels, stride, n, yp, nthreads); break;
      case 32: run<float, 2>(xp, M, K, wp, panels, stride, n, yp, nthreads); break;
      case 48: run<float, 3>(xp, M, K, wp, panels, stride, n, yp, nthreads); break;
      default: run<float, 4>(xp, M, K, wp, panels, stride, n, yp, nthreads); break;
    }
  }
  return y;
}

// Bytes the first row block prefetches ahead in the weight stream (0 turns it off).
void set_prefetch_bytes(int64_t bytes) { g_prefetch_bytes = std::max<int64_t>(0, bytes); }
