// The int8-activation matmuls' constants and quantized x, shared by their copies for each
// instruction set (q4_1_int8act_cpu.cpp, q4_1_int8act_avx2.cpp; int8act_kernel.h has the
// rest). Include it inside the copy's namespace, before its own definitions.
#pragma once

namespace {
constexpr int64_t kLanes = 16;  // output rows per group
constexpr int64_t kBlock = 32;  // inputs per block
constexpr int64_t kAhead = 8;   // blocks to prefetch ahead, as in the exact kernel
// A block whose largest |x| is below this quantizes to zeros with scale 0: near fp32's
// smallest normals, 1 / dx would overflow to inf.
constexpr float kTiniest = 1e-30f;

// x quantized per block: codes [M][K] (stored as int32 words: 4 codes each), and per block
// the scale dx, dx * sum(xq) (Q4_1's min term's factor) and sum(xq) itself (Q8_0's).
struct QuantizedX {
  int32_t* words;
  float* scale;
  float* scaled_sum;
  int32_t* sum;
};

inline void prefetch_ahead(const uint8_t* p, int64_t bytes) {
  for (int64_t line = 0; line < bytes; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p + kAhead * bytes + line), _MM_HINT_T0);
}

void check_x(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.dtype() == at::kFloat && x.dim() == 2 && x.is_contiguous(), name,
              ": x must be a contiguous float32 [rows, in] tensor");
  TORCH_CHECK(x.size(1) % kBlock == 0, name, ": x's ", x.size(1), " inputs are not blocks of ",
              kBlock);
}

}  // namespace
