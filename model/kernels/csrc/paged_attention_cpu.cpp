// Decode attention over the paged KV cache, reading K and V in place (CPU; fp32, or bf16
// K/V/q with fp32 arithmetic inside).
//
// One query token per sequence. Nothing is gathered, padded or copied: each slot of
// the pool ([kv_heads, dim] side by side) is read once, for every query head that
// attends to it. q may be a view with rows apart (the Q part of a QKV output); each task
// widens its sequence's query to floats, and the output is written in q's dtype.
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
//
// A task has two bodies. With AVX-512 and a head dim of 64, 128 or 256, the query heads that
// share a K/V head go together (attend_heads): each K and V row is loaded once for all of
// them, the 16 dot products of 16 tokens are reduced together, the V sums stay in registers,
// and the first pass asks for whole rows a few tokens ahead; bf16 rows are widened 32 values
// at a time, as their even and odd values (load16). Any other shape runs the plain loop
// (attend_generic). Both sum in fp32; they differ only in the order of the sums.
#include "kernel_api.h"
#include "parallel_errors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
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

// The shapes every task shares.
struct Shape {
  int64_t heads, dim, group, slot_stride;
  float scale;
};

// One task: tokens start .. start + n - 1 of one sequence (their pool rows in `slots`), and
// where its per-head partial results go.
struct Task {
  const float* q;        // [heads, dim]: the sequence's query, as floats (in load16's order)
  const int64_t* slots;  // [n]: each token's row in the pool
  int64_t n;
  float* scores;         // [heads, kPart]: scratch
  float* acc;            // [heads, dim]: sum of exp(score - max) * V row (load16's order)
  float* max;            // [heads]
  float* sum;            // [heads]: sum of exp(score - max)
};

// scores[0 .. n) -> exp(score - max) in place; the maximum and the sum of the exps.
inline void softmax_part(float* s, int64_t n, float* max_out, float* sum_out) {
  float peak = s[0];
  for (int64_t i = 1; i < n; ++i) peak = std::max(peak, s[i]);
  float total = 0.0f;
#pragma omp simd reduction(+ : total)
  for (int64_t i = 0; i < n; ++i) {
    s[i] = std::exp(s[i] - peak);
    total += s[i];
  }
  *max_out = peak;
  *sum_out = total;
}

// Any head dim: one dot product per (token, head), a bf16 slot widened once per token.
template <typename T>
void attend_generic(const Shape& shape, const T* kp, const T* vp, const Task& task) {
  const int64_t heads = shape.heads, dim = shape.dim, group = shape.group;
  std::vector<float> widened(shape.slot_stride);  // a bf16 slot as floats
  for (int64_t i = 0; i < task.n; ++i) {
    const float* slot = as_float(kp + task.slots[i] * shape.slot_stride, shape.slot_stride,
                                 widened.data());
    for (int64_t h = 0; h < heads; ++h)
      task.scores[h * kPart + i] = dot(task.q + h * dim, slot + (h / group) * dim, dim) *
                                   shape.scale;
  }
  for (int64_t h = 0; h < heads; ++h)
    softmax_part(task.scores + h * kPart, task.n, task.max + h, task.sum + h);
  std::fill(task.acc, task.acc + heads * dim, 0.0f);
  for (int64_t i = 0; i < task.n; ++i) {
    const float* slot = as_float(vp + task.slots[i] * shape.slot_stride, shape.slot_stride,
                                 widened.data());
    for (int64_t h = 0; h < heads; ++h) {
      const float* value = slot + (h / group) * dim;
      const float p = task.scores[h * kPart + i];
      float* a = task.acc + h * dim;
#pragma omp simd
      for (int64_t d = 0; d < dim; ++d) a[d] += p * value[d];
    }
  }
}

#if defined(__AVX512F__)
// Head dims that are a multiple of 16 (64, 128, 256), with AVX-512: the query heads that share
// a K/V head are done together, GH at a time, so each K and V row is loaded once for all of
// them, and the running sums stay in registers.

// Vector v (16 floats) of a K or V row. fp32: values 16v .. 16v + 15. bf16: the row is read
// 32 values at a time, and vector v holds the even (v even) or odd (v odd) values of its 32
// (32 (v / 2) + 2i + v % 2 in lane i), each widened by one AND or one shift instead of a
// widening shuffle; exact, as a bf16 is the top half of a float. Queries and outputs take the
// same order (query_floats, and the output's write in decode_attention), so only the order of
// each dot product's sum moves.
inline __m512 load16(const float* row, int v) { return _mm512_loadu_ps(row + 16 * v); }
inline __m512 load16(const c10::BFloat16* row, int v) {
  const __m512i pairs = _mm512_loadu_si512(row + 32 * (v / 2));
  return _mm512_castsi512_ps(v % 2 ? _mm512_and_si512(pairs, _mm512_set1_epi32(-65536))
                                   : _mm512_slli_epi32(pairs, 16));
}

// r[0..16) -> one vector whose lane i is the sum of r[i]'s 16 lanes (a transpose and add,
// 45 instructions for 16 sums instead of 16 separate horizontal reductions).
inline __m512 sum_lanes16(const __m512* r) {
  __m512 u[4];
  for (int m = 0; m < 4; ++m) {
    const __m512* x = r + 4 * m;
    // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3], the same for c and d
    const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(x[0], x[1]), _mm512_unpackhi_ps(x[0], x[1]));
    const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(x[2], x[3]), _mm512_unpackhi_ps(x[2], x[3]));
    // per 128-bit lane k: [a, b, c, d] summed over that lane's four floats
    u[m] = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // the four 128-bit lanes of each u[m] summed, u[m]'s total landing in lane m
  const __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(w01, w23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// The first pass over a task's rows asks for whole rows kPrefetch tokens ahead: the passes
// of the other heads then find them in cache, and the memory reads run ahead of the
// arithmetic instead of waiting on strided loads the hardware does not foresee.
constexpr int64_t kPrefetch = 4;

template <typename T>
inline void prefetch_row(const T* row, int64_t bytes) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t line = 0; line < bytes; line += 64) _mm_prefetch(p + line, _MM_HINT_T0);
}

// Query heads h0 .. h0 + GH - 1, all reading K/V head h0 / group; DV vectors per row.
template <typename T, int DV, int GH>
void attend_heads(const Shape& shape, const T* kp, const T* vp, const Task& task, int64_t h0) {
  const int64_t dim = shape.dim, kv_offset = (h0 / shape.group) * dim;
  const int64_t row_bytes = shape.slot_stride * static_cast<int64_t>(sizeof(T));
  const bool first_pass = h0 == 0;
  if (first_pass)
    for (int64_t i = 0; i < std::min(kPrefetch, task.n); ++i) {
      prefetch_row(kp + task.slots[i] * shape.slot_stride, row_bytes);
      prefetch_row(vp + task.slots[i] * shape.slot_stride, row_bytes);
    }
  const float* q = task.q + h0 * dim;
  const __m512 scale = _mm512_set1_ps(shape.scale);
  __m512 partial[GH][16];  // per head, 16 tokens' unreduced dot products
  for (int64_t i0 = 0; i0 < task.n; i0 += 16) {
    const int64_t count = std::min<int64_t>(16, task.n - i0);
    for (int64_t i = 0; i < 16; ++i) {
      __m512 a[GH];
      for (int j = 0; j < GH; ++j) a[j] = _mm512_setzero_ps();
      if (i < count) {
        if (first_pass && i0 + i + kPrefetch < task.n) {  // V too: the V pass finds it cached
          prefetch_row(kp + task.slots[i0 + i + kPrefetch] * shape.slot_stride, row_bytes);
          prefetch_row(vp + task.slots[i0 + i + kPrefetch] * shape.slot_stride, row_bytes);
        }
        const T* key = kp + task.slots[i0 + i] * shape.slot_stride + kv_offset;
        for (int v = 0; v < DV; ++v) {
          const __m512 k = load16(key, v);
          for (int j = 0; j < GH; ++j)
            a[j] = _mm512_fmadd_ps(_mm512_loadu_ps(q + j * dim + 16 * v), k, a[j]);
        }
      }
      for (int j = 0; j < GH; ++j) partial[j][i] = a[j];
    }
    const __mmask16 valid = static_cast<__mmask16>((1u << count) - 1u);
    for (int j = 0; j < GH; ++j)
      _mm512_mask_storeu_ps(task.scores + (h0 + j) * kPart + i0, valid,
                            _mm512_mul_ps(sum_lanes16(partial[j]), scale));
  }
  for (int j = 0; j < GH; ++j)
    softmax_part(task.scores + (h0 + j) * kPart, task.n, task.max + h0 + j, task.sum + h0 + j);
  __m512 acc[GH][DV];
  for (int j = 0; j < GH; ++j)
    for (int v = 0; v < DV; ++v) acc[j][v] = _mm512_setzero_ps();
  for (int64_t i = 0; i < task.n; ++i) {
    const T* value = vp + task.slots[i] * shape.slot_stride + kv_offset;
    __m512 p[GH];
    for (int j = 0; j < GH; ++j) p[j] = _mm512_set1_ps(task.scores[(h0 + j) * kPart + i]);
    for (int v = 0; v < DV; ++v) {
      const __m512 x = load16(value, v);
      for (int j = 0; j < GH; ++j) acc[j][v] = _mm512_fmadd_ps(p[j], x, acc[j][v]);
    }
  }
  for (int j = 0; j < GH; ++j)
    for (int v = 0; v < DV; ++v) _mm512_storeu_ps(task.acc + (h0 + j) * dim + 16 * v, acc[j][v]);
}

// Every head of the task, in chunks of at most 16 / DV heads of one group (so the running
// sums fit in 16 registers).
template <typename T, int DV>
void attend_simd(const Shape& shape, const T* kp, const T* vp, const Task& task) {
  constexpr int kMaxHeads = 16 / DV;
  for (int64_t h0 = 0; h0 < shape.heads;) {
    const int64_t left_in_group = shape.group - h0 % shape.group;
    const int chunk = static_cast<int>(std::min<int64_t>(kMaxHeads, left_in_group));
    switch (chunk) {
      case 1: attend_heads<T, DV, 1>(shape, kp, vp, task, h0); break;
      case 2: if constexpr (kMaxHeads >= 2) attend_heads<T, DV, 2>(shape, kp, vp, task, h0); break;
      case 3: if constexpr (kMaxHeads >= 3) attend_heads<T, DV, 3>(shape, kp, vp, task, h0); break;
      default: if constexpr (kMaxHeads >= 4) attend_heads<T, DV, 4>(shape, kp, vp, task, h0); break;
    }
    h0 += chunk;
  }
}
#endif

// Does this build run the AVX-512 body (attend_heads) for this head dim?
inline bool simd_body(int64_t dim) {
#if defined(__AVX512F__)
  return dim == 64 || dim == 128 || dim == 256;
#else
  (void)dim;
  return false;
#endif
}

// Does the task body for this head dim keep a bf16 row's values in load16's even/odd order?
template <typename T>
bool splits_pairs(int64_t dim) {
  return std::is_same_v<T, c10::BFloat16> && simd_body(dim);
}

// A sequence's query [heads * dim] as floats, in the order its task body reads K and V in.
inline const float* query_floats(const float* row, int64_t, int64_t, float*) { return row; }
inline const float* query_floats(const c10::BFloat16* row, int64_t n, int64_t dim,
                                 float* buffer) {
  if (!splits_pairs<c10::BFloat16>(dim)) return as_float(row, n, buffer);
  for (int64_t c = 0; c < n; c += 32)  // value c + 2i + s to c + 16s + i
    for (int64_t i = 0; i < 16; ++i)
      for (int64_t s = 0; s < 2; ++s)
        buffer[c + 16 * s + i] = static_cast<float>(row[c + 2 * i + s]);
  return buffer;
}

// The task on the fastest body this build has for its head dim.
template <typename T>
void attend(const Shape& shape, const T* kp, const T* vp, const Task& task) {
#if defined(__AVX512F__)
  if (simd_body(shape.dim)) {  // load16's order, which splits_pairs reports
    if (shape.dim == 64) return attend_simd<T, 4>(shape, kp, vp, task);
    if (shape.dim == 128) return attend_simd<T, 8>(shape, kp, vp, task);
    return attend_simd<T, 16>(shape, kp, vp, task);
  }
#endif
  attend_generic(shape, kp, vp, task);
}

// One call's task list and per-task sums (decode_attention).
struct Buffers {
  std::vector<int64_t> task_seq, task_start, first_task;
  std::vector<float> part_max, part_sum, part_acc;
};
}  // namespace

template <typename T>
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& block_tables,
                            const at::Tensor& context_lens, double scale,
                            int64_t window);

at::Tensor paged_decode_attention(at::Tensor q,             // [batch, heads, dim]
                                  at::Tensor k_cache,       // [blocks, block_size, kv_heads, dim]
                                  at::Tensor v_cache,       // same
                                  at::Tensor block_tables,  // [batch, max_blocks] int64
                                  at::Tensor context_lens,  // [batch] int64
                                  double scale,
                                  int64_t window) {         // 0: the whole context
  TORCH_CHECK(q.dtype() == k_cache.dtype() && q.dtype() == v_cache.dtype() &&
                  (q.dtype() == at::kFloat || q.dtype() == at::kBFloat16),
              "paged_decode_attention: q, K and V all float32 or all bfloat16");
  if (q.dtype() == at::kBFloat16)
    return decode_attention<c10::BFloat16>(q, k_cache, v_cache, block_tables, context_lens, scale,
                                           window);
  return decode_attention<float>(q, k_cache, v_cache, block_tables, context_lens, scale, window);
}

template <typename T>
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& block_tables,
                            const at::Tensor& context_lens, double scale,
                            int64_t window) {
  TORCH_CHECK(window >= 0, "paged_decode_attention: window must be >= 0");
  TORCH_CHECK(block_tables.dtype() == at::kLong && context_lens.dtype() == at::kLong,
              "paged_decode_attention: int64 block tables and lengths");
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1 && q.stride(1) == q.size(2) &&
                  k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  block_tables.is_contiguous() && context_lens.is_contiguous(),
              "paged_decode_attention: contiguous tensors expected (q: contiguous rows)");
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
  const int64_t group = heads / kv_heads, max_blocks = block_tables.size(1);
  TORCH_CHECK(k_cache.size(3) == dim && heads % kv_heads == 0 && v_cache.sizes() == k_cache.sizes(),
              "paged_decode_attention: shapes");

  const T* qp = q.data_ptr<T>();
  const int64_t q_stride = q.stride(0);
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  const int64_t slot_stride = kv_heads * dim;
  const float fscale = static_cast<float>(scale);

  // Task list: (sequence, first token) for every part of every sequence. The lists and the
  // parts' sums are kept between calls (a decode step calls this once a layer), in the
  // calling thread's buffers; every slot is written below before it is read. (Local
  // references: inside the parallel regions, the name of a thread_local would mean each
  // thread's own.)
  thread_local Buffers kept;
  std::vector<int64_t>& task_seq = kept.task_seq;
  std::vector<int64_t>& task_start = kept.task_start;
  std::vector<int64_t>& first_task = kept.first_task;
  task_seq.clear();
  task_start.clear();
  first_task.resize(batch + 1);
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
  std::vector<float>& part_max = kept.part_max;
  std::vector<float>& part_sum = kept.part_sum;
  std::vector<float>& part_acc = kept.part_acc;
  part_max.resize(num_tasks * heads);
  part_sum.resize(num_tasks * heads);
  part_acc.resize(num_tasks * heads * dim);

  const Shape shape{heads, dim, group, slot_stride, fscale};

  ParallelErrors errors;  // the per-thread buffers below may fail to grow (parallel_errors.h)
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < num_tasks; ++task) errors.capture([&] {
    const int64_t b = task_seq[task], start = task_start[task];
    const int64_t n = std::min(kPart, lens[b] - start);
    const int64_t* table = tables + b * max_blocks;
    thread_local std::vector<float> scores, query;
    thread_local std::vector<int64_t> slots;
    scores.resize(heads * kPart);
    slots.resize(kPart);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = start + i;
      slots[i] = table[t / block_size] * block_size + t % block_size;
    }
    if constexpr (!std::is_same_v<T, float>) query.resize(heads * dim);  // fp32: read in place
    const float* q_row = query_floats(qp + b * q_stride, heads * dim, dim, query.data());
    attend(shape, kp, vp,
           Task{q_row, slots.data(), n, scores.data(),
                part_acc.data() + task * heads * dim, part_max.data() + task * heads,
                part_sum.data() + task * heads});
  });
  errors.rethrow("paged_decode_attention");

  const bool split = splits_pairs<T>(dim);  // the sums below are in even/odd order
  auto out = at::empty({batch, heads, dim}, q.options());
  T* op = out.data_ptr<T>();
#pragma omp parallel for
  for (int64_t b = 0; b < batch; ++b) errors.capture([&] {
    thread_local std::vector<float> merged;
    merged.resize(dim);
    float* o = merged.data();
    for (int64_t h = 0; h < heads; ++h) {
      float peak = part_max[first_task[b] * heads + h];
      for (int64_t task = first_task[b] + 1; task < first_task[b + 1]; ++task)
        peak = std::max(peak, part_max[task * heads + h]);
      float total = 0.0f;
      std::fill(o, o + dim, 0.0f);
      for (int64_t task = first_task[b]; task < first_task[b + 1]; ++task) {
        const float w = std::exp(part_max[task * heads + h] - peak);
        total += w * part_sum[task * heads + h];
        const float* a = part_acc.data() + (task * heads + h) * dim;
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) o[d] += w * a[d];
      }
      const float inv = 1.0f / total;
      T* dst = op + (b * heads + h) * dim;
      if (split) {
        for (int64_t c = 0; c < dim; c += 32)
          for (int64_t i = 0; i < 16; ++i)
            for (int64_t s = 0; s < 2; ++s)
              dst[c + 2 * i + s] = static_cast<T>(o[c + 16 * s + i] * inv);
      } else {
        for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<T>(o[d] * inv);
      }
    }
  });
  errors.rethrow("paged_decode_attention");
  return out;
}
