// The bf16 product of dense_linear.cpp (read its header first) on CPUs with AMX (Intel
// Sapphire Rapids and later), for rows that need several of the AVX-512 path's row blocks.
//
// The packed bf16 panel is already what AMX's tile multiply takes as its right operand: a
// step (one k pair) holds each column's pair (k, k+1) side by side, so 16 steps of 16 columns
// are one B tile (16 rows of 64 bytes, a panel row apart). x gives the A tiles (16 rows x
// 32 k; the last block is x's last 16 rows, or fewer padded with zero rows). Per panel of
// NB = 16 * G columns, each block of 16 rows keeps G accumulator tiles (16 x 16 fp32); tiles
// 0-3 accumulate, 4 holds A, 5 and 6 take turns holding B. As in the AVX-512 path, the row
// blocks walk the panel a chunk of steps at a time (read from memory once, from cache by the
// other blocks); by default a chunk is all of K (dense_linear.cpp's g_amx_chunk_steps says
// why), summed in fp32 by the tile unit, and the result is rounded to bf16 once (nearest
// even). Products of bf16 pairs are exact in fp32.
#include <ATen/Parallel.h>
#include "kernel_api.h"

#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "dense_prefetch.h"
#include "dense_scratch.h"

// Only what follows may use AMX and AVX-512; amx_usable() is built for any x86-64 CPU.
namespace dense_amx {

// Does the CPU have AMX-TILE and AMX-BF16, and has the kernel let this process use the tile
// registers (Linux asks each process to request them once)? Never in a build for a target
// without AMX (NANO_VLLM_CPU=avx512, model/kernels/build.py).
bool amx_usable() {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  static const bool usable = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    const bool tile = edx & (1u << 24), bf16 = edx & (1u << 22);
    if (!tile || !bf16) return false;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return usable;
#else
  return false;
#endif
}

}  // namespace dense_amx

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")

namespace dense_amx {
namespace {

using B = c10::BFloat16;
constexpr int64_t kRows = 16;  // rows per block (an A tile's)
constexpr int64_t kSub = 16;   // steps per tile multiply (a B tile's rows)

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: 16 x 16 fp32 sums; 4: 16 rows x 32 bf16 of x; 5, 6: 16 steps x 16 columns.
void configure() {
  TileConfig cfg;
  for (int t = 0; t < 7; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  // Not _tile_loadconfig: GCC 12's asm there names only the configuration's first 8 bytes as
  // its input, so the compiler may drop the stores to the rest (a test program of ours faulted
  // that way at -O3). This asm takes all 64 bytes.
  asm volatile("ldtilecfg %0" : : "m"(cfg));
}

// One chunk (`n` steps from w, a multiple of kSub) of one row block against G groups of 16
// columns; the chunk's sums (16 rows x 16 * G) are stored into `sums` (row stride NB).
template <int G>
void chunk_product(const B* x, int64_t ldx, const B* w, int64_t n, float* sums,
                   const char* pf, int64_t pf_lines) {
  constexpr int64_t NB = 16 * G;
  if constexpr (G > 0) _tile_zero(0);
  if constexpr (G > 1) _tile_zero(1);
  if constexpr (G > 2) _tile_zero(2);
  if constexpr (G > 3) _tile_zero(3);
  const int64_t subs = n / kSub;
  int64_t due = 0;
  for (int64_t i = 0; i < subs; ++i) {
    dense_prefetch::spread(due, pf, pf_lines, subs);
    const B* wi = w + i * kSub * 2 * NB;
    _tile_loadd(4, x + i * kSub * 2, ldx * sizeof(B));
    _tile_loadd(5, wi, NB * 2 * sizeof(B));
    _tile_dpbf16ps(0, 4, 5);
    if constexpr (G > 1) {
      _tile_loadd(6, wi + 32, NB * 2 * sizeof(B));
      _tile_dpbf16ps(1, 4, 6);
    }
    if constexpr (G > 2) {
      _tile_loadd(5, wi + 64, NB * 2 * sizeof(B));
      _tile_dpbf16ps(2, 4, 5);
    }
    if constexpr (G > 3) {
      _tile_loadd(6, wi + 96, NB * 2 * sizeof(B));
      _tile_dpbf16ps(3, 4, 6);
    }
  }
  constexpr int64_t stride = NB * sizeof(float);
  _tile_stored(0, sums, stride);
  if constexpr (G > 1) _tile_stored(1, sums + 16, stride);
  if constexpr (G > 2) _tile_stored(2, sums + 32, stride);
  if constexpr (G > 3) _tile_stored(3, sums + 48, stride);
}

// What the last row block's A tiles read (a tile load takes 16 rows), and the row of x its
// first row is. From 16 rows, x's last 16 rows: those it shares with the block before are
// computed twice, the same bits, and taken from that block. Below 16, x's rows then zero rows
// in scratch memory.
std::pair<const B*, int64_t> last_block(const B* x, int64_t M, int64_t ldx) {
  if (M >= kRows) return {x + (M - kRows) * ldx, M - kRows};
  B* padded = reinterpret_cast<B*>(dense_scratch::floats(dense_scratch::kX, kRows * ldx / 2));
  std::copy(x, x + M * ldx, padded);
  std::fill(padded + M * ldx, padded + kRows * ldx, B(0.0f));
  return {padded, 0};
}

template <int G>
void run(const B* x, int64_t M, int64_t ldx, const B* packed, int64_t panels, int64_t N, B* y,
         int nthreads, int64_t chunk, int64_t prefetch) {
  constexpr int64_t NB = 16 * G;
  const int64_t steps = ldx / 2, blocks = (M + kRows - 1) / kRows;
  chunk = chunk > 0 ? std::max<int64_t>(kSub, chunk / kSub * kSub) : steps;  // 0: all of K
  const bool one_chunk = chunk >= steps;  // the chunk's sums are the result
  // Per thread: the chunk's sums, then (several chunks) the running ones.
  const int64_t sums_size = blocks * kRows * NB, per_thread = (one_chunk ? 1 : 2) * sums_size;
  float* scratch = dense_scratch::floats(dense_scratch::kPartial, nthreads * per_thread);
  const std::pair<const B*, int64_t> last_rows = last_block(x, M, ldx);
  const B* last = last_rows.first;
  const int64_t last_first = last_rows.second;
  const int64_t last_sums = (blocks - 1) * kRows;  // the last block's first row in the sums
  const char* bytes = reinterpret_cast<const char*>(packed);
  const int64_t total_bytes = panels * steps * 2 * NB * static_cast<int64_t>(sizeof(B));

#pragma omp parallel num_threads(nthreads)
  {
    configure();
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t p0 = panels * t / nt, p1 = panels * (t + 1) / nt;
    float* sums = scratch + t * per_thread;
    float* total = one_chunk ? sums : sums + sums_size;
    for (int64_t p = p0; p < p1; ++p) {
      const B* panel = packed + p * steps * 2 * NB;
      for (int64_t s0 = 0; s0 < steps; s0 += chunk) {
        const int64_t n = std::min(chunk, steps - s0);
        const int64_t offset = (p * steps + s0) * 2 * NB * static_cast<int64_t>(sizeof(B));
        const auto ahead = dense_prefetch::window(bytes, total_bytes, offset, prefetch,
                                                  n * NB * 4 / 64);
        for (int64_t b = 0; b < blocks; ++b) {
          const B* a = b == blocks - 1 ? last : x + b * kRows * ldx;
          chunk_product<G>(a + 2 * s0, ldx, panel + s0 * 2 * NB, n, sums + b * kRows * NB,
                           ahead.part_start(b, blocks), ahead.part_lines(b, blocks));
        }
        if (one_chunk) break;
        if (s0 == 0) {
          std::copy(sums, sums + sums_size, total);
        } else {
          for (int64_t i = 0; i < sums_size; i += 16)
            _mm512_storeu_ps(total + i, _mm512_add_ps(_mm512_loadu_ps(total + i),
                                                      _mm512_loadu_ps(sums + i)));
        }
      }
      const int64_t valid = std::min<int64_t>(NB, N - p * NB);
      for (int64_t m = 0; m < M; ++m) {
        const int64_t row = m < last_sums ? m : last_sums + m - last_first;
        for (int64_t j = 0; j < NB; j += 16) {
          if (valid - j <= 0) break;
          const __m256i out = (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(total + row * NB + j));
          const __mmask16 mask = valid - j >= 16 ? static_cast<__mmask16>(0xFFFF)
                                                 : static_cast<__mmask16>((1u << (valid - j)) - 1);
          _mm256_mask_storeu_epi16(y + m * N + p * NB + j, mask, out);
        }
      }
    }
    _tile_release();
  }
}

}  // namespace

// y [M, N] = x [M, ldx] (bf16, ldx / 2 a multiple of 16) @ the packed panels of width NB;
// amx_usable() must hold.
void linear_bf16(const B* x, int64_t M, int64_t ldx, const B* packed, int64_t panels, int64_t NB,
                 int64_t N, B* y, int nthreads, int64_t chunk, int64_t prefetch) {
  switch (NB) {
    case 16: return run<1>(x, M, ldx, packed, panels, N, y, nthreads, chunk, prefetch);
    case 32: return run<2>(x, M, ldx, packed, panels, N, y, nthreads, chunk, prefetch);
    case 48: return run<3>(x, M, ldx, packed, panels, N, y, nthreads, chunk, prefetch);
    default: return run<4>(x, M, ldx, packed, panels, N, y, nthreads, chunk, prefetch);
  }
}

}  // namespace dense_amx
#pragma GCC pop_options
