// The small ops between the matmuls, fused (CPU; fp32, or bf16 computed in fp32).
//
// In a decode step each of these runs on a few rows of a few hundred values: the work is
// tiny and the cost is the number of ops. PyTorch spends 5-8 ops (and as many temporary
// tensors) on an RMSNorm with its residual add, 5 on RoPE, 3 on SwiGLU's activation; each
// function here is one pass over the data. Inputs of many values (prefill chunks, a decode
// step of tens of users) are split over rows with OpenMP; small ones stay on the calling
// thread, where a fork would cost more than the work.
#include "kernel_api.h"

#include <algorithm>
#include <cmath>

namespace {
// Rows are split over threads from this many values on (rows x row width): at 30 rows of
// the default model's widths (576 for a norm, 1,536 for SwiGLU) the split pays; one row
// never is split.
constexpr int64_t kParallelValues = 8192;

inline bool split_rows(int64_t rows, int64_t width) {
  return rows > 1 && rows * width >= kParallelValues;
}

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const c10::BFloat16* p, int64_t i) { return static_cast<float>(p[i]); }
inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(c10::BFloat16* p, int64_t i, float v) { p[i] = c10::BFloat16(v); }

// Calls f with a value of the tensor's element type: float or c10::BFloat16.
template <typename F>
void dispatch(at::ScalarType type, F&& f) {
  if (type == at::kBFloat16) {
    f(c10::BFloat16{});
  } else {
    f(0.0f);
  }
}

void check_rows(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.dim() == 2 && t.stride(1) == 1, what, ": rows of contiguous values expected");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, what,
              ": float32 or bfloat16 only");
}

// out = rmsnorm(residual (+= delta)) * weight, row by row.
template <typename T>
void add_rms_norm_rows(T* residual, const T* delta, int64_t delta_stride, const T* weight,
                       T* out, int64_t rows, int64_t dim, int64_t stride, float eps) {
#pragma omp parallel for if (split_rows(rows, dim))
  for (int64_t r = 0; r < rows; ++r) {
    T* x = residual + r * stride;
    float sum = 0.0f;
    if (delta != nullptr) {
      const T* d = delta + r * delta_stride;
      for (int64_t i = 0; i < dim; ++i) {
        const float v = load(x, i) + load(d, i);
        store(x, i, v);
      }
    }
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < dim; ++i) {
      const float v = load(x, i);
      sum += v * v;
    }
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(dim) + eps);
    T* o = out + r * dim;
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) store(o, i, load(x, i) * inv * load(weight, i));
  }
}

// Rotate-half RoPE in place over `heads` heads of `dim` values per row.
template <typename T>
void rope_rows(T* qk, int64_t rows, int64_t heads, int64_t dim, int64_t row_stride,
               const T* cos, const T* sin, int64_t table_stride) {
  const int64_t half = dim / 2;
#pragma omp parallel for if (split_rows(rows, heads * dim))
  for (int64_t r = 0; r < rows; ++r) {
    const T* c = cos + r * table_stride;
    const T* s = sin + r * table_stride;
    for (int64_t h = 0; h < heads; ++h) {
      T* x = qk + r * row_stride + h * dim;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float a = load(x, i), b = load(x, i + half);
        // x * cos + rotate_half(x) * sin, where rotate_half(x) = (-b, a)
        store(x, i, a * load(c, i) - b * load(s, i));
        store(x, i + half, b * load(c, i + half) + a * load(s, i + half));
      }
    }
  }
}

// out = silu(gate) * up, gate and up side by side in each row.
template <typename T>
void silu_mul_rows(const T* gate_up, T* out, int64_t rows, int64_t width, int64_t stride) {
#pragma omp parallel for if (split_rows(rows, width))
  for (int64_t r = 0; r < rows; ++r) {
    const T* g = gate_up + r * stride;
    T* o = out + r * width;
#pragma omp simd
    for (int64_t i = 0; i < width; ++i) {
      const float x = load(g, i);
      // (exp's argument is capped so that -ffast-math never meets an overflow; silu is ~0
      // there anyway)
      store(o, i, x / (1.0f + std::exp(std::min(-x, 80.0f))) * load(g, width + i));
    }
  }
}
}  // namespace

// residual += delta (unless delta is empty); returns rmsnorm(residual) * weight.
at::Tensor add_rms_norm(at::Tensor residual, at::Tensor delta, at::Tensor weight,
                        double eps) {
  check_rows(residual, "add_rms_norm");
  TORCH_CHECK(residual.is_contiguous(), "add_rms_norm: contiguous residual expected");
  const bool has_delta = delta.numel() > 0;
  if (has_delta) {
    check_rows(delta, "add_rms_norm");
    TORCH_CHECK(delta.sizes() == residual.sizes() && delta.dtype() == residual.dtype(),
                "add_rms_norm: delta must match residual");
  }
  TORCH_CHECK(weight.is_contiguous() && weight.dtype() == residual.dtype() &&
                  weight.numel() == residual.size(1),
              "add_rms_norm: weight");
  auto out = at::empty_like(residual);
  const int64_t rows = residual.size(0), dim = residual.size(1);
  dispatch(residual.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    add_rms_norm_rows<scalar_t>(residual.data_ptr<scalar_t>(),
                                has_delta ? delta.data_ptr<scalar_t>() : nullptr,
                                has_delta ? delta.stride(0) : 0, weight.data_ptr<scalar_t>(),
                                out.data_ptr<scalar_t>(), rows, dim, residual.stride(0),
                                static_cast<float>(eps));
  });
  return out;
}

// qk: [rows, heads * dim] (a view into the QKV output is fine); cos, sin: [rows, dim].
void rope_inplace(at::Tensor qk, int64_t heads, at::Tensor cos, at::Tensor sin) {
  check_rows(qk, "rope_inplace");
  check_rows(cos, "rope_inplace");
  TORCH_CHECK(sin.sizes() == cos.sizes() && sin.strides() == cos.strides() &&
                  cos.dtype() == qk.dtype() && sin.dtype() == qk.dtype(),
              "rope_inplace: cos and sin must match each other and qk's dtype");
  const int64_t rows = qk.size(0), dim = cos.size(1);
  TORCH_CHECK(cos.size(0) == rows && qk.size(1) == heads * dim && dim % 2 == 0,
              "rope_inplace: shapes");
  dispatch(qk.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    rope_rows<scalar_t>(qk.data_ptr<scalar_t>(), rows, heads, dim, qk.stride(0),
                        cos.data_ptr<scalar_t>(), sin.data_ptr<scalar_t>(), cos.stride(0));
  });
}

at::Tensor silu_mul(at::Tensor gate_up) {
  check_rows(gate_up, "silu_mul");
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "silu_mul: gate and up of equal width expected");
  const int64_t rows = gate_up.size(0), width = gate_up.size(1) / 2;
  auto out = at::empty({rows, width}, gate_up.options());
  dispatch(gate_up.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    silu_mul_rows<scalar_t>(gate_up.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), rows, width,
                            gate_up.stride(0));
  });
  return out;
}
