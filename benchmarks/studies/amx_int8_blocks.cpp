// Study: Q4_1 codes times int8 activations on Intel's tile unit (AMX-INT8) against
// AVX512-VNNI, in the format of `--activations int8` (blocks of 32 inputs, each with its own
// weight and activation scales). Not part of the server: the tile unit was measured this way
// and not kept (docs/quantized.md, `--activations int8`). On a CPU with AMX-INT8 (Linux 5.16+):
//
//   g++ -O3 -march=native -fopenmp -std=c++20 benchmarks/studies/amx_int8_blocks.cpp -o /tmp/amx_int8_blocks && /tmp/amx_int8_blocks
//
// For 30 rows of x against all 30 layers' matmul shapes of the default model (random codes
// in model/kernels/csrc/q4_1_int8act_cpu.cpp's byte layout), at 1 and 2 threads, best of 30, ms:
//   vnni       register tiles of 8 rows: 8 vpdpbusd per row and block, then the scales
//   amx        per 16 rows and block one tdpbsud, the tile stored, the same fp32 steps
//   amx-tiles  the tile unit's part of amx alone (multiplies, tile stores)
//   amx-fp32   the fp32 part of amx alone (loads of stored products, the scales)
// and checks that vnni and amx give the same sums bit for bit.
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

constexpr int64_t kBlockBytes = 320;  // d[16], m[16] fp16, codes[4][16][4]
constexpr int64_t kRows = 30;         // rows of x (30 users' decode step)
constexpr int64_t kPadded = 32;       // two A tiles of 16
constexpr int64_t kShapes[4][2] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0, 1: 16 x 16 int32 products; 2: 16 rows of x by 32 codes; 3: one block's codes.
void configure() {
  TileConfig cfg;
  cfg.rows[0] = cfg.rows[1] = cfg.rows[2] = 16;
  cfg.colsb[0] = cfg.colsb[1] = 64;
  cfg.colsb[2] = 32;
  cfg.rows[3] = 8;
  cfg.colsb[3] = 64;
  asm volatile("ldtilecfg %0" : : "m"(cfg));  // _tile_loadconfig names only 8 of its bytes
}

struct X {  // x quantized per block: codes [kPadded][K], scales and scaled sums per block
  const int8_t* codes;
  const float* scale;
  const float* scaled_sum;
};

inline __m512 halves(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// The server's fp32 steps for one row and block: total + dx (d dot + m sum(xq)).
inline __m512 scale_add(__m512 d, __m512 m, __m512i dot, float dx, float scaled_sum,
                        __m512 total) {
  total = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, _mm512_set1_ps(dx)), total);
  return _mm512_fmadd_ps(m, _mm512_set1_ps(scaled_sum), total);
}

void unpack(const uint8_t* p, __m512i (&c)[8]) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  for (int i = 0; i < 4; ++i) {
    const __m512i v = _mm512_loadu_si512(p + 64 + 64 * i);
    c[i] = _mm512_and_si512(v, nibble);
    c[4 + i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
  }
}

void vnni_group(const X& x, int64_t blocks, const uint8_t* w, float* y, int64_t N,
                int64_t n0) {
  for (int64_t m0 = 0; m0 < kRows; m0 += 8) {
    const int64_t rows = std::min<int64_t>(8, kRows - m0);
    __m512 total[8];
    for (auto& t : total) t = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* p = w + b * kBlockBytes;
      const __m512 d = halves(p), m = halves(p + 32);
      __m512i c[8];
      unpack(p, c);
      for (int r = 0; r < 8; ++r) {
        if (r >= rows) break;
        const int64_t i = (m0 + r) * blocks + b;
        const int32_t* words = reinterpret_cast<const int32_t*>(x.codes + i * 32);
        __m512i acc = _mm512_setzero_si512();
        for (int k = 0; k < 8; ++k) acc = _mm512_dpbusd_epi32(acc, c[k], _mm512_set1_epi32(words[k]));
        total[r] = scale_add(d, m, acc, x.scale[i], x.scaled_sum[i], total[r]);
      }
    }
    for (int64_t r = 0; r < rows; ++r) _mm512_storeu_ps(y + (m0 + r) * N + n0, total[r]);
  }
}

enum class Part { kAll, kTiles, kFp32 };

template <int T>
void multiply(const X& x, int64_t blocks, const uint8_t* tiles, int64_t m0, int64_t b) {
  const int64_t row_bytes = blocks * 32;
  if constexpr (T == 0) _tile_zero(0); else _tile_zero(1);  // the macros take literals
  _tile_loadd(2, x.codes + m0 * row_bytes + b * 32, row_bytes);
  _tile_loadd(3, tiles + b * 512, 64);
  if constexpr (T == 0) _tile_dpbsud(0, 2, 3); else _tile_dpbsud(1, 2, 3);
}

template <int T>
void store(int32_t* dots) {
  if constexpr (T == 0) _tile_stored(0, dots, 64); else _tile_stored(1, dots, 64);
}

void add(const X& x, int64_t blocks, const uint8_t* w, int64_t m0, int64_t b,
         const int32_t* dots, __m512 (&total)[16]) {
  const __m512 d = halves(w + b * kBlockBytes), m = halves(w + b * kBlockBytes + 32);
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) {
    const int64_t i = (m0 + r) * blocks + b;
    total[r] = scale_add(d, m, _mm512_load_si512(dots + 16 * r), x.scale[i], x.scaled_sum[i],
                         total[r]);
  }
}

// 16 rows from m0 against one group whose blocks are unpacked as B tiles; the tile unit
// works a block ahead of the fp32 steps (tiles 0 and 1 take turns).
template <Part P>
void amx_rows(const X& x, int64_t blocks, const uint8_t* w, const uint8_t* tiles, int64_t m0,
              float* y, int64_t N, int64_t n0) {
  __m512 total[16];
#pragma GCC unroll 16
  for (auto& t : total) t = _mm512_setzero_ps();
  alignas(64) int32_t dots[2][256] = {};
  const bool tile_unit = P != Part::kFp32, fp32 = P != Part::kTiles;
  if (tile_unit) multiply<0>(x, blocks, tiles, m0, 0);
  for (int64_t b = 0; b < blocks; ++b) {
    if (tile_unit) {
      if (b % 2 == 0) {
        store<0>(dots[0]);
        if (b + 1 < blocks) multiply<1>(x, blocks, tiles, m0, b + 1);
      } else {
        store<1>(dots[1]);
        if (b + 1 < blocks) multiply<0>(x, blocks, tiles, m0, b + 1);
      }
    }
    if (fp32) add(x, blocks, w, m0, b, dots[b % 2], total);
  }
  for (int64_t r = 0; r < std::min<int64_t>(16, kRows - m0); ++r)
    _mm512_storeu_ps(y + (m0 + r) * N + n0, total[r]);
}

template <Part P>
void amx_group(const X& x, int64_t blocks, const uint8_t* w, uint8_t* tiles, float* y,
               int64_t N, int64_t n0) {
  for (int64_t b = 0; b < blocks; ++b) {
    __m512i c[8];
    unpack(w + b * kBlockBytes, c);
    for (int k = 0; k < 8; ++k) _mm512_store_si512(tiles + b * 512 + 64 * k, c[k]);
  }
  for (int64_t m0 = 0; m0 < kRows; m0 += 16) amx_rows<P>(x, blocks, w, tiles, m0, y, N, n0);
}

struct Layer {
  std::vector<uint8_t> codes;
  int64_t N, K;
};

// All layers' matmuls once, the groups split between the threads (as in the server).
template <int Way>  // 0: vnni, 1..3: amx Part kAll, kTiles, kFp32
void pass(const std::vector<Layer>& layers, const X (&xs)[2], std::vector<float>& y,
          std::vector<uint8_t*>& scratch) {
  for (int layer = 0; layer < 30; ++layer)
    for (const Layer& l : layers) {
      const int64_t blocks = l.K / 32;
      const X& x = xs[l.K == 576 ? 0 : 1];
#pragma omp parallel
      {
        if constexpr (Way > 0) configure();
        uint8_t* tiles = scratch[omp_get_thread_num()];
#pragma omp for schedule(static)
        for (int64_t g = 0; g < l.N / 16; ++g) {
          const uint8_t* w = l.codes.data() + g * blocks * kBlockBytes;
          if constexpr (Way == 0) vnni_group(x, blocks, w, y.data(), l.N, g * 16);
          if constexpr (Way == 1) amx_group<Part::kAll>(x, blocks, w, tiles, y.data(), l.N, g * 16);
          if constexpr (Way == 2) amx_group<Part::kTiles>(x, blocks, w, tiles, y.data(), l.N, g * 16);
          if constexpr (Way == 3) amx_group<Part::kFp32>(x, blocks, w, tiles, y.data(), l.N, g * 16);
        }
        if constexpr (Way > 0) _tile_release();
      }
    }
}

template <int Way>
double best_ms(const std::vector<Layer>& layers, const X (&xs)[2], std::vector<float>& y,
               std::vector<uint8_t*>& scratch) {
  double best = 1e30;
  for (int repeat = 0; repeat < 31; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    pass<Way>(layers, xs, y, scratch);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (repeat > 0) best = std::min(best, ms);  // the first is a warm-up
  }
  return best;
}

}  // namespace

int main() {
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (!__builtin_cpu_supports("avx512vnni") ||
      syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) != 0) {
    std::fprintf(stderr, "needs AVX512-VNNI and AMX that Linux lets this process use\n");
    return 1;
  }
  std::mt19937 random(1);
  std::vector<Layer> layers;
  for (const auto& shape : kShapes) {
    Layer l{std::vector<uint8_t>(shape[0] / 16 * (shape[1] / 32) * kBlockBytes), shape[0],
            shape[1]};
    for (size_t i = 0; i < l.codes.size(); ++i) {
      const bool scale = i % kBlockBytes < 64;  // fp16 d and m: small positive halves
      l.codes[i] = scale ? (i % 2 ? 0x2C : random() & 0xFF) : random() & 0xFF;
    }
    layers.push_back(std::move(l));
  }
  std::vector<int8_t> codes[2];
  std::vector<float> scale[2], scaled_sum[2];
  X xs[2];
  for (int k = 0; k < 2; ++k) {
    const int64_t K = k == 0 ? 576 : 1536;
    codes[k].assign(kPadded * K, 0);
    for (int64_t i = 0; i < kRows * K; ++i) codes[k][i] = static_cast<int8_t>(random() % 255 - 127);
    scale[k].assign(kPadded * K / 32, 0.0f);
    scaled_sum[k].assign(kPadded * K / 32, 0.0f);
    for (int64_t i = 0; i < kRows * K / 32; ++i) {
      scale[k][i] = 0.01f + (random() % 100) * 1e-4f;
      scaled_sum[k][i] = (static_cast<int>(random() % 2001) - 1000) * 1e-3f;
    }
    xs[k] = {codes[k].data(), scale[k].data(), scaled_sum[k].data()};
  }
  std::vector<float> y(kPadded * 3072), reference(kPadded * 3072);
  const int most_threads = std::min(2, omp_get_max_threads());
  std::vector<uint8_t*> scratch;
  for (int t = 0; t < most_threads; ++t)
    scratch.push_back(static_cast<uint8_t*>(std::aligned_alloc(64, 48 * 512)));

  // Bit for bit: the last layer shape's sums (the loop leaves them in y).
  omp_set_num_threads(1);
  pass<0>(layers, xs, reference, scratch);
  pass<1>(layers, xs, y, scratch);
  const bool same = std::memcmp(y.data(), reference.data(), kRows * 576 * sizeof(float)) == 0;
  std::printf("amx equals vnni bit for bit: %s\n", same ? "yes" : "NO");
  std::printf("30 rows x all layers' matmuls, best of 30, ms\n");
  std::printf("threads      vnni       amx amx-tiles  amx-fp32\n");
  for (int threads = 1; threads <= most_threads; ++threads) {
    omp_set_num_threads(threads);
    std::printf("%7d %9.2f %9.2f %9.2f %9.2f\n", threads, best_ms<0>(layers, xs, y, scratch),
                best_ms<1>(layers, xs, y, scratch), best_ms<2>(layers, xs, y, scratch),
                best_ms<3>(layers, xs, y, scratch));
  }
  return same ? 0 : 1;
}
