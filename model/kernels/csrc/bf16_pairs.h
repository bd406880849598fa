// x's bf16 values as fp32 for the dense GEMM's FMA paths (dense_tile_avx512.h and
// dense_linear_avx2.cpp), which sum each k pair (k, k+1) as k+1 first, then k: the order in
// which Intel defines vdpbf16ps. So each pair's two values are swapped on the way.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

// Internal linkage: each including file compiles (and vectorizes) its own copy for its target.
namespace bf16_pairs {
namespace {

// `pairs` pairs of bf16 from `in` to 2 * pairs floats at `out`, each pair swapped. Exact.
inline void to_fp32_swapped(const c10::BFloat16* in, int64_t pairs, float* out) {
  const auto* bits = reinterpret_cast<const uint16_t*>(in);
  auto* words = reinterpret_cast<uint32_t*>(out);
  for (int64_t i = 0; i < pairs; ++i) {
    words[2 * i] = static_cast<uint32_t>(bits[2 * i + 1]) << 16;
    words[2 * i + 1] = static_cast<uint32_t>(bits[2 * i]) << 16;
  }
}

}  // namespace
}  // namespace bf16_pairs
