// Decode attention over the paged KV cache, reading K and V in place (CPU; fp32, or bf16
// K/V/q with fp32 arithmetic inside).
//
// One query token per sequence. Nothing is gathered, padded or copied: each slot of
// the pool ([kv_heads, dim] side by side) is read once, for every query head that
// attends to it.
//
// Work is split like flash-decoding: a sequence's tokens are cut into parts of
// kPart tokens, and each (sequence, part) is a task that any core can take. A task
// keeps, per query head, the running maximum score, the sum of exp(score - max)
// and the exp-weighted sum of V rows. A second pass merges a sequence's parts by
// rescaling each to the common maximum. So one long sequence still uses every
// core, and many short ones spread evenly.
//
// With a window w > 0 (sliding-window layers), a sequence of length n attends only to its
// last w tokens, n - w .. n - 1: its parts start there instead of at token 0.
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {
constexpr int64_t kPart = 256;  // tokens per task

// dot(a, b) over kDim floats; with kDim known at compile time the loop unrolls fully into
// a few vector FMAs (head_dim 64 is the common case; 128 for Qwen3, 256 for Gemma 3).
template <int64_t kDim>
inline float dot_fixed(const float* a, const float* b) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t d = 0; d < kDim; ++d) sum += a[d] * b[d];
  return sum;
}

inline float dot(const float* a, const float* b, int64_t dim) {
  if (dim == 64) return dot_fixed<64>(a, b);
  if (dim == 128) return dot_fixed<128>(a, b);
  if (dim == 256) return dot_fixed<256>(a, b);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t d = 0; d < dim; ++d) sum += a[d] * b[d];
  return sum;
}

// A slot's [kv_heads * dim] values as floats: fp32 slots are read in place, bf16 ones are
// widened into `buffer` (exact: a bf16 is the top half of a float).
inline const float* as_float(const float* slot, int64_t, float*) { return slot; }
inline const float* as_float(const c10::BFloat16* slot, int64_t n, float* buffer) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(slot);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t widened = static_cast<uint32_t>(bits[i]) << 16;
    float value;
    std::memcpy(&value, &widened, sizeof(value));
    buffer[i] = value;
  }
  return buffer;
}
}  // namespace

template <typename T>
torch::Tensor decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache,
                               const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                               const torch::Tensor& context_lens, double scale,
                               int64_t window);

torch::Tensor paged_decode_attention(torch::Tensor q,             // [batch, heads, dim]
                                     torch::Tensor k_cache,       // [blocks, block_size, kv_heads, dim]
                                     torch::Tensor v_cache,       // same
                                     torch::Tensor block_tables,  // [batch, max_blocks] int64
                                     torch::Tensor context_lens,  // [batch] int64
                                     double scale,
                                     int64_t window) {            // 0: the whole context
  // Pure C++ from here on: let the server's other Python threads run meanwhile.
  pybind11::gil_scoped_release no_gil;
  TORCH_CHECK(q.dtype() == k_cache.dtype() && q.dtype() == v_cache.dtype() &&
                  (q.dtype() == torch::kFloat32 || q.dtype() == torch::kBFloat16),
              "paged_decode_attention: q, K and V all float32 or all bfloat16");
  if (q.dtype() == torch::kBFloat16)
    return decode_attention<c10::BFloat16>(q, k_cache, v_cache, block_tables, context_lens, scale,
                                           window);
  return decode_attention<float>(q, k_cache, v_cache, block_tables, context_lens, scale, window);
}

template <typename T>
torch::Tensor decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache,
                               const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                               const torch::Tensor& context_lens, double scale,
                               int64_t window) {
  TORCH_CHECK(window >= 0, "paged_decode_attention: window must be >= 0");
  TORCH_CHECK(block_tables.dtype() == torch::kInt64 && context_lens.dtype() == torch::kInt64,
              "paged_decode_attention: int64 block tables and lengths");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  block_tables.is_contiguous() && context_lens.is_contiguous(),
              "paged_decode_attention: contiguous tensors expected");
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
  const int64_t group = heads / kv_heads, max_blocks = block_tables.size(1);
  TORCH_CHECK(k_cache.size(3) == dim && heads % kv_heads == 0 && v_cache.sizes() == k_cache.sizes(),
              "paged_decode_attention: shapes");

  const auto q_float = q.to(torch::kFloat32);  // small: one row per sequence
  const float* qp = q_float.data_ptr<float>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  const int64_t slot_stride = kv_heads * dim;
  const float fscale = static_cast<float>(scale);

  // Task list: (sequence, first token) for every part of every sequence.
  std::vector<int64_t> task_seq, task_start, first_task(batch + 1, 0);
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(lens[b] >= 1 && lens[b] <= max_blocks * block_size,
                "paged_decode_attention: context length outside its block table");
    for (int64_t i = 0; i < (lens[b] + block_size - 1) / block_size; ++i)
      TORCH_CHECK(tables[b * max_blocks + i] >= 0 && tables[b * max_blocks + i] < k_cache.size(0),
                  "paged_decode_attention: block id outside the pool");
    first_task[b] = static_cast<int64_t>(task_seq.size());
    const int64_t first = window > 0 ? std::max<int64_t>(0, lens[b] - window) : 0;
    for (int64_t start = first; start < lens[b]; start += kPart) {
      task_seq.push_back(b);
      task_start.push_back(start);
    }
  }
  const int64_t num_tasks = static_cast<int64_t>(task_seq.size());
  first_task[batch] = num_tasks;
  std::vector<float> part_max(num_tasks * heads), part_sum(num_tasks * heads);
  std::vector<float> part_acc(num_tasks * heads * dim);

#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < num_tasks; ++task) {
    const int64_t b = task_seq[task], start = task_start[task];
    const int64_t n = std::min(kPart, lens[b] - start);
    const int64_t* table = tables + b * max_blocks;
    const float* qb = qp + b * heads * dim;
    // Nothing may throw in here (an exception cannot leave an OpenMP region): every check
    // is done above.
    std::vector<float> scores(heads * kPart);  // [heads][n]
    std::vector<float> widened(slot_stride);  // a bf16 slot as floats

    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = start + i;
      const float* slot = as_float(
          kp + (table[t / block_size] * block_size + t % block_size) * slot_stride, slot_stride,
          widened.data());
      for (int64_t h = 0; h < heads; ++h) {
        scores[h * kPart + i] = dot(qb + h * dim, slot + (h / group) * dim, dim) * fscale;
      }
    }
    float* acc = part_acc.data() + task * heads * dim;
    std::fill(acc, acc + heads * dim, 0.0f);
    for (int64_t h = 0; h < heads; ++h) {
      float* s = scores.data() + h * kPart;
      float peak = s[0];
      for (int64_t i = 1; i < n; ++i) peak = std::max(peak, s[i]);
      float total = 0.0f;
#pragma omp simd reduction(+ : total)
      for (int64_t i = 0; i < n; ++i) {
        s[i] = std::exp(s[i] - peak);
        total += s[i];
      }
      part_max[task * heads + h] = peak;
      part_sum[task * heads + h] = total;
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = start + i;
      const float* slot = as_float(
          vp + (table[t / block_size] * block_size + t % block_size) * slot_stride, slot_stride,
          widened.data());
      for (int64_t h = 0; h < heads; ++h) {
        const float* value = slot + (h / group) * dim;
        const float p = scores[h * kPart + i];
        float* a = acc + h * dim;
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) a[d] += p * value[d];
      }
    }
  }

  auto out = torch::empty_like(q_float);
  float* op = out.data_ptr<float>();
#pragma omp parallel for
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      float peak = part_max[first_task[b] * heads + h];
      for (int64_t task = first_task[b] + 1; task < first_task[b + 1]; ++task)
        peak = std::max(peak, part_max[task * heads + h]);
      float total = 0.0f;
      float* o = op + (b * heads + h) * dim;
      std::fill(o, o + dim, 0.0f);
      for (int64_t task = first_task[b]; task < first_task[b + 1]; ++task) {
        const float w = std::exp(part_max[task * heads + h] - peak);
        total += w * part_sum[task * heads + h];
        const float* a = part_acc.data() + (task * heads + h) * dim;
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) o[d] += w * a[d];
      }
      const float inv = 1.0f / total;
#pragma omp simd
      for (int64_t d = 0; d < dim; ++d) o[d] *= inv;
    }
  }
  return out.to(q.scalar_type());
}
