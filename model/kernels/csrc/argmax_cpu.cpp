// Each row's argmax over a batch of logits, for greedy decoding.
//
// At 30 users a step's logits are 30 rows of the vocabulary (49,152 here). Taking their argmax
// through torch or NumPy costs the calling thread a widened copy (bf16) and a pass on one
// thread while the step's other compute thread waits. Here the rows are split over the
// threads and read in their own dtype.
//
// The comparisons are on integer keys, so that -ffast-math (which lets the compiler assume no
// NaN) cannot change the answer: a float's bits, the negative ones' magnitude bits flipped,
// order as the floats do; both zeros get the key 0 and every NaN the largest key. As in torch
// and NumPy, a NaN is the maximum and the first of equal maxima wins.
#include <ATen/Parallel.h>
#include "kernel_api.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

namespace {

inline int32_t order_key(uint32_t bits) {
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  const uint32_t sign_fill = static_cast<uint32_t>(static_cast<int32_t>(bits) >> 31);
  const int32_t key = magnitude == 0 ? 0 : static_cast<int32_t>(bits ^ (sign_fill & 0x7FFFFFFFu));
  return magnitude > 0x7F800000u ? std::numeric_limits<int32_t>::max() : key;  // NaN: largest
}

inline uint32_t bits_of(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}

inline uint32_t bits_of(c10::BFloat16 v) { return static_cast<uint32_t>(v.x) << 16; }

// One pass keeps each span's largest key (a vectorized max) and the first span that holds the
// row's largest; only that span is searched again for its first position.
constexpr int64_t kSpan = 512;

template <typename T>
int64_t row_argmax(const T* row, int64_t n) {
  int32_t best = std::numeric_limits<int32_t>::min();
  int64_t where = 0;
  for (int64_t s = 0; s < n; s += kSpan) {
    const int64_t e = std::min(n, s + kSpan);
    int32_t top = std::numeric_limits<int32_t>::min();
#pragma omp simd reduction(max : top)
    for (int64_t i = s; i < e; ++i) top = std::max(top, order_key(bits_of(row[i])));
    if (top > best) {
      best = top;
      where = s;
    }
  }
  for (int64_t i = where; i < std::min(n, where + kSpan); ++i)
    if (order_key(bits_of(row[i])) == best) return i;
  return where;  // not reached: the span holds `best`
}

template <typename T>
void argmax_all(const T* data, int64_t rows, int64_t n, int64_t stride, int64_t* out) {
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) out[r] = row_argmax(data + r * stride, n);
  });
}

}  // namespace

// logits [rows, vocab] (float32 or bfloat16, each row contiguous) -> int64 [rows]: each row's
// index of its largest value (the first of equals; a NaN counts as the largest).
at::Tensor argmax_rows(at::Tensor logits) {
  TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2 && logits.size(1) > 0 &&
                  logits.stride(1) == 1,
              "argmax_rows: logits must be a CPU [rows, vocab] tensor with contiguous rows");
  const int64_t rows = logits.size(0), n = logits.size(1), stride = logits.stride(0);
  auto out = at::empty({rows}, logits.options().dtype(at::kLong));
  int64_t* dst = out.data_ptr<int64_t>();
  if (logits.scalar_type() == at::kFloat) {
    argmax_all(logits.data_ptr<float>(), rows, n, stride, dst);
  } else {
    TORCH_CHECK(logits.scalar_type() == at::kBFloat16,
                "argmax_rows: float32 or bfloat16 logits only, got ", logits.scalar_type());
    argmax_all(logits.data_ptr<c10::BFloat16>(), rows, n, stride, dst);
  }
  return out;
}
