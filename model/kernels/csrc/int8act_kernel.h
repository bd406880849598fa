// The int8-activation matmul (q4_1_int8act_cpu.cpp explains the sums and the layout), its
// parts that do not depend on the instruction set: the row tiles over each group's blocks,
// the threads, the entry points. Each file that includes it first includes
// int8act_blocks.h (the constants and the quantized x), then defines for its own
// instruction set
//   kRows             rows of x per register tile,
//   V                 a group's 16 fp32 sums (vzero(), vstore_first(p, v, count): lanes
//                     [0, count)),
//   quantize_block    one block of 32 inputs -> its codes, scale, scaled sum and sum,
//   Codes, Q4_1, Q8_0 one group's block unpacked (F::load(p, codes), F::kBytes),
//   block_product<F>  total + one row of x's block times the group's block,
// then includes this in the same namespace: its kernels have internal linkage, its entry
// points (q4_1, q8_0, quantize_rows) that namespace's name, so each file keeps the copy built
// for its target. No includes here: include "kernel_api.h", <omp.h>, <immintrin.h>,
// <algorithm>, <cstring>, <tuple>, <vector> and "quantized_checks.h" before it.
#pragma once

namespace {

// Blocks [begin, end) of the M x (K / 32) blocks of x (row-major).
void quantize_blocks(const float* x, int64_t begin, int64_t end, const QuantizedX& out) {
  for (int64_t i = begin; i < end; ++i)
    quantize_block(x + i * kBlock, reinterpret_cast<int8_t*>(out.words + i * (kBlock / 4)),
                   out.scale + i, out.scaled_sum + i, out.sum + i);
}

// R rows of x from row m0 against one group (outputs n0 .. n0 + 15), over all blocks: the
// tile's sums stay in registers, and each block's codes are unpacked once for all R rows.
template <class F, int R>
void tile(const QuantizedX& xq, int64_t blocks, const uint8_t* w, int64_t m0, float* y,
          int64_t N, int64_t n0) {
  V total[R];
  for (int r = 0; r < R; ++r) total[r] = vzero();
  const bool prefetch = m0 == 0;  // later row tiles find the group's codes in L1
  for (int64_t b = 0; b < blocks; ++b) {
    if (prefetch) prefetch_ahead(w + b * F::kBytes, F::kBytes);
    Codes codes;
    F::load(w + b * F::kBytes, codes);
    for (int r = 0; r < R; ++r)
      total[r] = block_product<F>(codes, xq, (m0 + r) * blocks + b, total[r]);
  }
  const int64_t valid = std::min<int64_t>(kLanes, N - n0);
  for (int r = 0; r < R; ++r) vstore_first(y + (m0 + r) * N + n0, total[r], valid);
}

// The last rows < R rows from m0, as one tile of exactly that many.
template <class F, int R>
void last_rows(int64_t rows, const QuantizedX& xq, int64_t blocks, const uint8_t* w,
               int64_t m0, float* y, int64_t N, int64_t n0) {
  if constexpr (R > 0) {
    if (rows == R) return tile<F, R>(xq, blocks, w, m0, y, N, n0);
    last_rows<F, R - 1>(rows, xq, blocks, w, m0, y, N, n0);
  }
}

// All M rows of x against group g (its codes at w).
template <class F>
void group(int64_t M, const QuantizedX& xq, int64_t blocks, const uint8_t* w, float* y,
           int64_t N, int64_t g) {
  int64_t m0 = 0;
  for (; m0 + kRows <= M; m0 += kRows) tile<F, kRows>(xq, blocks, w, m0, y, N, g * kLanes);
  last_rows<F, kRows - 1>(M - m0, xq, blocks, w, m0, y, N, g * kLanes);
}

// Threads first quantize x's blocks between them, then split the output groups.
template <class F>
at::Tensor int8act_linear(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                          const char* name) {
  check_x(x, name);
  quantized_checks::check_packed(x, packed, N, F::kBytes, name);
  const int64_t M = x.size(0), K = x.size(1), groups = packed.size(0), blocks = K / kBlock;
  auto y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  // Everything is allocated here: nothing may throw inside the OpenMP region.
  std::vector<int32_t> words(M * K / 4), sum(M * blocks);
  std::vector<float> scale(M * blocks), scaled_sum(M * blocks);
  const QuantizedX xq{words.data(), scale.data(), scaled_sum.data(), sum.data()};
  const float* xp = x.data_ptr<float>();
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  const int64_t group_bytes = blocks * F::kBytes;
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), me = omp_get_thread_num();
    const int64_t all = M * blocks;
    quantize_blocks(xp, all * me / threads, all * (me + 1) / threads, xq);
#pragma omp barrier
#pragma omp for schedule(static)
    for (int64_t g = 0; g < groups; ++g)
      group<F>(M, xq, blocks, wp + g * group_bytes, yp, N, g);
  }
  return y;
}

}  // namespace

// The entry points of this instruction set's copy (declared by whoever dispatches to it).
at::Tensor q4_1(const at::Tensor& x, const at::Tensor& packed, int64_t n) {
  return int8act_linear<Q4_1>(x, packed, n, "q4_1_int8act_linear");
}

at::Tensor q8_0(const at::Tensor& x, const at::Tensor& packed, int64_t n) {
  return int8act_linear<Q8_0>(x, packed, n, "q8_0_int8act_linear");
}

// x's int8 codes [M, K], scales [M, K / 32] and scaled sums [M, K / 32], exactly as the
// matmuls compute them (for the tests).
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x) {
  check_x(x, "quantize_rows_int8");
  const int64_t M = x.size(0), K = x.size(1), blocks = K / kBlock;
  auto codes = at::empty({M, K}, x.options().dtype(at::kChar));
  auto scale = at::empty({M, blocks}, x.options());
  auto scaled_sum = at::empty({M, blocks}, x.options());
  std::vector<int32_t> words(M * K / 4), sum(M * blocks);
  const QuantizedX xq{words.data(), scale.data_ptr<float>(), scaled_sum.data_ptr<float>(),
                      sum.data()};
  quantize_blocks(x.data_ptr<float>(), 0, M * blocks, xq);
  std::memcpy(codes.data_ptr<int8_t>(), words.data(), M * K);
  return {codes, scale, scaled_sum};
}
