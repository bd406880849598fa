// Prefill attention over the paged KV cache, reading K and V in place (CPU; fp32, or bf16
// K/V/q with fp32 arithmetic inside).
//
// One chunk of n query rows of one sequence, at positions context_len - n .. context_len - 1.
// Their own K/V are already in the pool (written before attention runs), so every key, cached
// or new, is read through the block table the same way: nothing is gathered or masked up
// front. Query i sees keys 0 .. its position (and, with a window w > 0, only the last w).
//
// A task is one K/V head and a tile of query positions; its rows are (position, query head
// of that K/V head's group), up to kRows of them, so the group's heads share each K/V row
// read. The task walks its keys in tiles of kKeys with an online softmax (running maximum,
// sum of exponentials, and output accumulator per row, rescaled when the maximum grows):
//   scores  S[key][row] = K[key] . Q[row]: Q is held transposed, [dim][row], so each K
//           element is broadcast against 16 rows at once (a K row is read in place);
//   output  acc[row][:] += p[key][row] * V[key][:]: each V row is read in place.
// Both are register-blocked with GCC vector types (16 floats; the compiler maps them onto
// whatever vector width the CPU has). bf16 K/V rows, or rows whose dim is not a multiple of
// 16, are first widened into a small per-tile buffer (exact for bf16). The softmax works on
// whole vectors of rows with an exp of its own (exp_nonpositive), and needs no mask on the
// tiles every row sees whole: before it did, the softmax took about half the kernel's time.
// A chunk's positions are cut into tiles of near-equal size, enough for every thread.
#include <omp.h>
// benchmarks/studies/prefill_attention_task.cpp includes this file with PREFILL_TASK_ONLY
// defined, to time the tasks alone: then only the task code below is compiled.
#ifdef PREFILL_TASK_ONLY
#include <c10/util/BFloat16.h>
#else
#include "kernel_api.h"
#endif
#include "parallel_errors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {
typedef float vf __attribute__((vector_size(64)));  // 16 floats
constexpr int64_t kLanes = 16;
constexpr int64_t kKeys = 32;  // keys per tile (a multiple of kKeyBlock)
constexpr int64_t kRows = 64;  // rows (positions x group heads) per task, at most
// Register blocking: score_block's vectors of rows (4 keys each, while that many vectors of rows
// are left; the 1-3 vectors of rows left take kKeyBlock keys), value_block's rows and vectors of
// the head dimension. With AVX2 (16 registers, each half a 16-float vector) 8 accumulators,
// which measured faster than 4 (Intel Xeon, family 6 model 167, the AVX2 build: 63-71 GFLOP/s
// against 56-59). With AVX-512 (32 registers) 16 for the scores of whole blocks, and 24 where
// more sums in flight measured faster on that CPU: the rows left over score 8 keys at a time
// (a 30-position chunk of a group of 3 is 3 vectors of rows per task: 8 keys at once instead
// of 2 + 1 vectors against 4 took 7-12% off the kernel for 30 positions after 660 cached), and
// the V sum takes 6 rows (alone on hot data 1.30-1.44 multiply-add vectors a cycle against
// 1.14-1.17 with 4; AVX-512 only, the AVX2 build keeps its blocks).
#ifdef __AVX512F__
constexpr int kScoreVectors = 4, kValueRows = 6, kValueVectors = 4, kKeyBlock = 8;
#else
constexpr int kScoreVectors = 2, kValueRows = 2, kValueVectors = 4, kKeyBlock = 4;
#endif
static_assert(kKeys % kKeyBlock == 0 && kKeyBlock % 4 == 0,
              "a tile's keys, padded to whole key blocks, must fit its kKeys rows of pointers");
constexpr float kNone = -1e30f;  // the running maximum of a row that has seen no key yet

// The softmax's vectors: 16 floats with AVX-512; 8 with AVX2, where GCC would split the
// compares and selects of 16-float vectors into scalar code.
#ifdef __AVX512F__
constexpr int64_t kSoftmaxLanes = 16;
#else
constexpr int64_t kSoftmaxLanes = 8;
#endif
typedef float sf __attribute__((vector_size(4 * kSoftmaxLanes)));
typedef int32_t si __attribute__((vector_size(4 * kSoftmaxLanes)));

template <typename V = vf>
inline V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <typename V>
inline void store(float* p, V v) { std::memcpy(p, &v, sizeof(v)); }
template <typename V = vf>
inline V splat(float x) { return V{} + x; }

// e^x for x <= 0, lane by lane: 2^n e^r with n = round(x / ln 2), r = x - n ln 2 (|r| <=
// ln 2 / 2; ln 2 in two parts, so n ln 2 is exact), e^r by its Taylor series to r^7 (the rest
// is below 2^-27 of it). x below -87 (e^x under fp32's smallest normal) gives 0.
inline sf exp_nonpositive(sf x) {
  const si gone = x < splat<sf>(-87.0f);
  x = gone ? splat<sf>(-87.0f) : x;
  // Conversion rounds toward zero: for y <= 0, trunc(y - 1/2) is y rounded to nearest.
  const si n = __builtin_convertvector(x * splat<sf>(1.44269504f) - splat<sf>(0.5f), si);
  const sf nf = __builtin_convertvector(n, sf);
  const sf r = (x - nf * splat<sf>(0.693145751953125f)) - nf * splat<sf>(1.428606765330187e-6f);
  sf e = splat<sf>(1.0f / 5040);
  e = e * r + splat<sf>(1.0f / 720);
  e = e * r + splat<sf>(1.0f / 120);
  e = e * r + splat<sf>(1.0f / 24);
  e = e * r + splat<sf>(1.0f / 6);
  e = e * r + splat<sf>(0.5f);
  e = e * r + splat<sf>(1.0f);
  e = e * r + splat<sf>(1.0f);
  const sf two_n = reinterpret_cast<sf>((n + 127) << 23);
  return gone ? splat<sf>(0.0f) : e * two_n;
}

// The online softmax's update for kSoftmaxLanes rows over one tile of scores s[j * rp]
// (j < keys_padded, the keys past `keys` padding): the running maximum m grows to the tile's,
// alpha is how much the old sums shrink (l is rescaled here, the output accumulators by
// value_block), and each score becomes its weight, added to l. Key t0 + j is visible to a
// row at position pos whose window starts after lo; `open`: to every row.
inline void softmax_tile(float* s, int64_t rp, int64_t keys, int64_t keys_padded, float t0,
                         bool open, const float* pos, const float* lo, float* m, float* l,
                         float* alpha) {
  const sf at = load<sf>(pos), after = load<sf>(lo), old = load<sf>(m);
  auto visible = [&](int64_t j) {
    const sf t = splat<sf>(t0 + static_cast<float>(j));
    return (t <= at) & (t > after);
  };
  sf top = old;
  for (int64_t j = 0; j < keys; ++j) {
    const sf x = load<sf>(s + j * rp);
    const sf grown = x > top ? x : top;
    top = open ? grown : (visible(j) ? grown : top);
  }
  const sf shrink = exp_nonpositive(old - top);
  sf sum = load<sf>(l) * shrink;
  for (int64_t j = 0; j < keys; ++j) {
    sf p = exp_nonpositive(load<sf>(s + j * rp) - top);
    if (!open) p = visible(j) ? p : splat<sf>(0.0f);
    store(s + j * rp, p);
    sum += p;
  }
  for (int64_t j = keys; j < keys_padded; ++j) store(s + j * rp, splat<sf>(0.0f));
  store(m, top);
  store(l, sum);
  store(alpha, shrink);
}

inline float widen(float x) { return x; }
inline float widen(c10::BFloat16 x) { return static_cast<float>(x); }

// S[j][r] = sum_d K[j][d] * Qt[d][r] for kK keys and kNv vectors of rows from r0.
template <int kK, int kNv>
inline void score_block(const float* const* keys, const float* qt, int64_t rp, int64_t dim,
                        int64_t r0, float* s) {
  vf acc[kK][kNv] = {};
  for (int64_t d = 0; d < dim; ++d) {
    vf q[kNv];
    for (int v = 0; v < kNv; ++v) q[v] = load(qt + d * rp + r0 + v * kLanes);
    for (int i = 0; i < kK; ++i) {
      const vf k = splat(keys[i][d]);
      for (int v = 0; v < kNv; ++v) acc[i][v] += k * q[v];
    }
  }
  for (int i = 0; i < kK; ++i)
    for (int v = 0; v < kNv; ++v) store(s + i * rp + r0 + v * kLanes, acc[i][v]);
}

// Every score of one tile: S[j][r] for keys [0, padded) (a multiple of kKeyBlock) and all rp
// rows: 4 keys x kScoreVectors vectors of rows while that many are left, then kKeyBlock keys
// x the 1-3 vectors left. Each score is the same sum over d in the same order either way.
inline void score_tile(const float* const* keys, const float* qt, int64_t rp, int64_t dim,
                       int64_t padded, float* s) {
  int64_t r0 = 0;
  for (; r0 + kScoreVectors * kLanes <= rp; r0 += kScoreVectors * kLanes)
    for (int64_t j0 = 0; j0 < padded; j0 += 4)
      score_block<4, kScoreVectors>(keys + j0, qt, rp, dim, r0, s + j0 * rp);
  const int64_t left = (rp - r0) / kLanes;
  for (int64_t j0 = 0; j0 < padded && left > 0; j0 += kKeyBlock) {
    if constexpr (kScoreVectors > 3) {
      if (left == 3) {
        score_block<kKeyBlock, 3>(keys + j0, qt, rp, dim, r0, s + j0 * rp);
        continue;
      }
    }
    if constexpr (kScoreVectors > 2) {
      if (left == 2) {
        score_block<kKeyBlock, 2>(keys + j0, qt, rp, dim, r0, s + j0 * rp);
        continue;
      }
    }
    score_block<kKeyBlock, 1>(keys + j0, qt, rp, dim, r0, s + j0 * rp);
  }
}

// acc[r][dc..] = alpha[r] * acc[r][dc..] + sum_j p[j][r] * V[j][dc..] for kR rows from r and
// kNv vectors of the head dimension from dc.
template <int kR, int kNv>
inline void value_block(const float* const* values, const float* p, int64_t rp, int64_t keys,
                        int64_t r, int64_t dc, const float* alpha, float* acc, int64_t dimp) {
  vf c[kR][kNv];
  for (int i = 0; i < kR; ++i)
    for (int v = 0; v < kNv; ++v)
      c[i][v] = load(acc + (r + i) * dimp + dc + v * kLanes) * alpha[r + i];
  for (int64_t j = 0; j < keys; ++j) {
    vf w[kR];
    for (int i = 0; i < kR; ++i) w[i] = splat(p[j * rp + r + i]);
    for (int v = 0; v < kNv; ++v) {
      const vf x = load(values[j] + dc + v * kLanes);
      for (int i = 0; i < kR; ++i) c[i][v] += w[i] * x;
    }
  }
  for (int i = 0; i < kR; ++i)
    for (int v = 0; v < kNv; ++v) store(acc + (r + i) * dimp + dc + v * kLanes, c[i][v]);
}

// acc[r..r+kR) = alpha * acc + P V over the tile's keys: kValueVectors vectors of the head
// dimension at a time, then single vectors.
template <int kR>
inline void value_rows_at(const float* const* values, const float* p, int64_t rp, int64_t keys,
                          int64_t r, const float* alpha, float* acc, int64_t dimp) {
  int64_t dc = 0;
  for (; dc + kValueVectors * kLanes <= dimp; dc += kValueVectors * kLanes)
    value_block<kR, kValueVectors>(values, p, rp, keys, r, dc, alpha, acc, dimp);
  for (; dc < dimp; dc += kLanes) value_block<kR, 1>(values, p, rp, keys, r, dc, alpha, acc, dimp);
}

// Every row of the tile (rp, a multiple of 16), kValueRows at a time; with blocks of 6 the
// 2 or 4 rows left take a smaller block.
inline void value_tile(const float* const* values, const float* p, int64_t rp, int64_t keys,
                       const float* alpha, float* acc, int64_t dimp) {
  int64_t r = 0;
  for (; r + kValueRows <= rp; r += kValueRows)
    value_rows_at<kValueRows>(values, p, rp, keys, r, alpha, acc, dimp);
  if constexpr (kValueRows > 4)
    for (; r + 4 <= rp; r += 4) value_rows_at<4>(values, p, rp, keys, r, alpha, acc, dimp);
  if constexpr (kValueRows > 2)
    for (; r + 2 <= rp; r += 2) value_rows_at<2>(values, p, rp, keys, r, alpha, acc, dimp);
}

struct Shape {
  int64_t n, heads, kv_heads, dim, group, block_size, context_len, window;
};

// One task: K/V head g, query positions [q0, q0 + count) of the chunk.
template <typename T>
void prefill_task(const Shape& sh, const T* qp, const T* kp, const T* vp, const int64_t* table,
                  float scale, int64_t g, int64_t q0, int64_t count, T* op) {
  const int64_t dim = sh.dim, group = sh.group, rows = count * group;
  const int64_t rp = (rows + kLanes - 1) / kLanes * kLanes;
  const int64_t dimp = (dim + kLanes - 1) / kLanes * kLanes;
  const int64_t slot_stride = sh.kv_heads * dim;
  const int64_t first = sh.context_len - sh.n;  // position of the chunk's row 0
  constexpr bool kBf16 = !std::is_same<T, float>::value;
  const bool in_place = !kBf16 && dim % kLanes == 0;

  std::vector<float> qt(dim * rp, 0.0f), s(kKeys * rp), acc(rp * dimp, 0.0f);
  std::vector<float> m(rp, kNone), l(rp, 0.0f), alpha(rp), pos(rp, -1.0f), lo(rp, -1.0f);
  std::vector<float> kbuf(kKeys * dimp, 0.0f), vbuf(kKeys * dimp, 0.0f), zero(dimp, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = q0 + r / group, head = g * group + r % group;
    const T* qrow = qp + (i * sh.heads + head) * dim;
    for (int64_t d = 0; d < dim; ++d) qt[d * rp + r] = widen(qrow[d]) * scale;
    pos[r] = static_cast<float>(first + i);
    lo[r] = sh.window > 0 ? pos[r] - static_cast<float>(sh.window) : -1.0f;
  }
  const int64_t last = first + q0 + count - 1;  // the task's last position
  const int64_t key_begin = sh.window > 0 ? std::max<int64_t>(0, first + q0 - sh.window + 1) : 0;
  const float* key_rows[kKeys];
  const float* value_rows[kKeys];
  for (int64_t t0 = key_begin; t0 <= last; t0 += kKeys) {
    const int64_t keys = std::min(kKeys, last + 1 - t0);
    const int64_t keys_padded = (keys + kKeyBlock - 1) / kKeyBlock * kKeyBlock;
    for (int64_t j = 0; j < keys_padded; ++j) {
      if (j >= keys) {
        key_rows[j] = value_rows[j] = zero.data();
        continue;
      }
      const int64_t t = t0 + j;
      const int64_t at = (table[t / sh.block_size] * sh.block_size + t % sh.block_size) *
                             slot_stride + g * dim;
      if (in_place) {
        key_rows[j] = reinterpret_cast<const float*>(kp + at);
        value_rows[j] = reinterpret_cast<const float*>(vp + at);
      } else {
        float* kb = kbuf.data() + j * dimp;
        float* vb = vbuf.data() + j * dimp;
        for (int64_t d = 0; d < dim; ++d) {
          kb[d] = widen(kp[at + d]);
          vb[d] = widen(vp[at + d]);
        }
        key_rows[j] = kb;
        value_rows[j] = vb;
      }
    }
    score_tile(key_rows, qt.data(), rp, dim, keys_padded, s.data());
    // Online softmax over this tile, a vector of rows at a time; keys a row may not see get
    // weight exactly 0. A tile every row sees whole (no window, its last key at or before
    // the task's first position: all but the last tiles of a chunk after a cached prefix)
    // needs no mask.
    const bool open = sh.window == 0 && t0 + keys - 1 <= first + q0;
    for (int64_t r = 0; r < rp; r += kSoftmaxLanes)
      softmax_tile(s.data() + r, rp, keys, keys_padded, static_cast<float>(t0), open,
                   pos.data() + r, lo.data() + r, m.data() + r, l.data() + r, alpha.data() + r);
    value_tile(value_rows, s.data(), rp, keys, alpha.data(), acc.data(), dimp);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = q0 + r / group, head = g * group + r % group;
    const float inv = 1.0f / l[r];
    T* orow = op + (i * sh.heads + head) * dim;
    for (int64_t d = 0; d < dim; ++d) orow[d] = static_cast<T>(acc[r * dimp + d] * inv);
  }
}

// How many tiles of near-equal size the chunk's n positions are cut into: as few as keep
// each task within kRows rows, then more while the tasks (tiles x K/V heads) do not share
// evenly among the threads and tiles of at least a vector of rows allow it (30 positions of
// a group of 3 on 3 K/V heads and 2 threads: 2 tiles of 15, not 21 + 9; 14 positions: 2 of
// 7, not 3 tasks on 2 threads).
int64_t whole_tiles(int64_t n, int64_t group) {
  const int64_t most = std::max<int64_t>(1, kRows / group);  // positions per task
  return (n + most - 1) / most;
}

int64_t count_tiles(int64_t n, int64_t group, int64_t kv_heads, int64_t threads) {
  const int64_t least = std::max<int64_t>(1, kLanes / group);
  int64_t tiles = whole_tiles(n, group);
  while ((tiles * kv_heads) % threads != 0 && n / (tiles + 1) >= least) ++tiles;
  return tiles;
}

// With at least this many tasks per thread when no chunk is cut finer than kRows rows, the
// tasks share out well enough among the threads as they are (longest first).
constexpr int64_t kWholeTasksPerThread = 4;

#ifndef PREFILL_TASK_ONLY
// One chunk's place in a call: its rows of q (and of the output) and its block table.
struct Chunk {
  Shape shape;
  int64_t start;         // first row in q
  const int64_t* table;  // its block table
};

// One task of one chunk: K/V head g, positions [q0, q0 + count); `work` orders the tasks.
struct Task {
  int64_t chunk, g, q0, count, work;
};

// Every chunk of a step in one parallel region, all the step's tasks handed out longest
// first. A chunk is cut as a call for it alone would cut it (count_tiles: finer where that
// shares a few tasks evenly), unless the step has many tasks without that: then each chunk
// is cut only to fit kRows rows a task, so vectors of rows are fuller and each K/V row read
// serves more of them. A row's sums are the same however its chunk is cut, but for a sliding
// window, whose key tiles start at the window of the task's first position: such chunks are
// always cut as a call of their own would cut them.
template <typename T>
at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k_cache,
                             const at::Tensor& v_cache, std::vector<Chunk>& chunks, double scale) {
  const int64_t threads = omp_get_max_threads();
  int64_t whole_tasks = 0;
  for (const Chunk& chunk : chunks)
    whole_tasks += whole_tiles(chunk.shape.n, chunk.shape.group) * chunk.shape.kv_heads;
  const bool many = whole_tasks >= kWholeTasksPerThread * threads;
  std::vector<Task> tasks;
  for (int64_t c = 0; c < static_cast<int64_t>(chunks.size()); ++c) {
    Shape& sh = chunks[c].shape;
    const int64_t tiles = many && sh.window == 0
                              ? whole_tiles(sh.n, sh.group)
                              : count_tiles(sh.n, sh.group, sh.kv_heads, threads);
    // Tile t holds positions [n t / tiles, n (t + 1) / tiles): every tile at least n / tiles
    // of them (count_tiles keeps tiles <= n). Cutting ceil(n / tiles) a tile instead left the
    // last tiles short, empty or, with more tiles than that cut needs (Gemma's group of 4 on
    // one K/V head: 391 positions, 26 tiles of 16), of negative size.
    for (int64_t tile = 0; tile < tiles; ++tile) {
      const int64_t q0 = sh.n * tile / tiles, count = sh.n * (tile + 1) / tiles - q0;
      const int64_t keys = sh.context_len - sh.n + q0 + count;  // the most any row sees
      const int64_t seen = sh.window > 0 ? std::min(keys, sh.window + count) : keys;
      for (int64_t g = 0; g < sh.kv_heads; ++g) tasks.push_back({c, g, q0, count, count * seen});
    }
  }
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task& a, const Task& b) { return a.work > b.work; });

  auto out = at::empty_like(q);
  const T* qp = q.data_ptr<T>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const float fscale = static_cast<float>(scale);
  const int64_t row_elems = q.size(1) * q.size(2);
  // Every check is done before; a task's buffers may still fail to be allocated, and an
  // exception cannot leave an OpenMP region (parallel_errors.h).
  ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < static_cast<int64_t>(tasks.size()); ++i) {
    errors.capture([&] {
      const Task& task = tasks[i];
      const Chunk& chunk = chunks[task.chunk];
      const int64_t offset = chunk.start * row_elems;
      prefill_task<T>(chunk.shape, qp + offset, kp, vp, chunk.table, fscale, task.g, task.q0,
                      task.count, op + offset);
    });
  }
  errors.rethrow("paged_prefill_attention");
  return out;
}

void check_tensors(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                   int64_t window) {
  TORCH_CHECK(q.dtype() == k_cache.dtype() && q.dtype() == v_cache.dtype() &&
                  (q.dtype() == at::kFloat || q.dtype() == at::kBFloat16),
              "paged_prefill_attention: q, K and V all float32 or all bfloat16");
  TORCH_CHECK(window >= 0, "paged_prefill_attention: window must be >= 0");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && k_cache.size(3) == q.size(2) &&
                  q.size(1) % k_cache.size(2) == 0 && v_cache.sizes() == k_cache.sizes(),
              "paged_prefill_attention: shapes");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "paged_prefill_attention: contiguous tensors expected");
}

// Chunk `n` rows from `start`, `context_len` tokens of context, through `table` (`width`
// entries): checked against q and the pool.
Chunk make_chunk(const at::Tensor& q, const at::Tensor& k_cache, int64_t start, int64_t n,
                 int64_t context_len, const int64_t* table, int64_t width, int64_t window) {
  Shape sh{};
  sh.n = n;
  sh.heads = q.size(1);
  sh.dim = q.size(2);
  sh.block_size = k_cache.size(1);
  sh.kv_heads = k_cache.size(2);
  sh.group = sh.heads / sh.kv_heads;
  sh.context_len = context_len;
  sh.window = window;
  TORCH_CHECK(n >= 1 && start >= 0 && start + n <= q.size(0),
              "paged_prefill_attention: a chunk's rows outside q");
  TORCH_CHECK(context_len >= n && context_len <= width * sh.block_size,
              "paged_prefill_attention: context length outside its block table");
  for (int64_t i = 0; i < (context_len + sh.block_size - 1) / sh.block_size; ++i)
    TORCH_CHECK(table[i] >= 0 && table[i] < k_cache.size(0),
                "paged_prefill_attention: block id outside the pool");
  return {sh, start, table};
}

at::Tensor run_chunks(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                      std::vector<Chunk>& chunks, double scale) {
  if (q.dtype() == at::kBFloat16)
    return prefill_attention<c10::BFloat16>(q, k_cache, v_cache, chunks, scale);
  return prefill_attention<float>(q, k_cache, v_cache, chunks, scale);
}
#endif  // PREFILL_TASK_ONLY
}  // namespace

#ifndef PREFILL_TASK_ONLY
at::Tensor paged_prefill_attention(at::Tensor q,            // [n, heads, dim]
                                   at::Tensor k_cache,      // [blocks, block_size, kv_heads, dim]
                                   at::Tensor v_cache,      // same
                                   at::Tensor block_table,  // [>= blocks of context] int64
                                   int64_t context_len,     // cached + these n tokens
                                   double scale,
                                   int64_t window) {        // 0: the whole context
  check_tensors(q, k_cache, v_cache, window);
  TORCH_CHECK(block_table.dtype() == at::kLong && block_table.is_contiguous(),
              "paged_prefill_attention: contiguous int64 block table");
  std::vector<Chunk> chunks{make_chunk(q, k_cache, 0, q.size(0), context_len,
                                       block_table.data_ptr<int64_t>(), block_table.size(0),
                                       window)};
  return run_chunks(q, k_cache, v_cache, chunks, scale);
}

// Several chunks (of different sequences) in one call: chunk c is rows [starts[c], starts[c] +
// lengths[c]) of q, with context_lens[c] tokens of context through row c of block_tables.
at::Tensor paged_prefill_attention_chunks(at::Tensor q,             // [rows, heads, dim]
                                          at::Tensor k_cache,       // as above
                                          at::Tensor v_cache,
                                          at::Tensor block_tables,  // [chunks, width] int64
                                          at::Tensor context_lens,  // [chunks] int64
                                          at::Tensor starts,        // [chunks] int64
                                          at::Tensor lengths,       // [chunks] int64
                                          double scale, int64_t window) {
  check_tensors(q, k_cache, v_cache, window);
  const int64_t n = block_tables.dim() == 2 ? block_tables.size(0) : -1;
  for (const at::Tensor* t : {&block_tables, &context_lens, &starts, &lengths})
    TORCH_CHECK(t->dtype() == at::kLong && t->is_contiguous() && t->device().is_cpu(),
                "paged_prefill_attention_chunks: contiguous int64 CPU tensors expected");
  TORCH_CHECK(n >= 0 && context_lens.numel() == n && starts.numel() == n &&
                  lengths.numel() == n,
              "paged_prefill_attention_chunks: one table, context length, start and length "
              "per chunk");
  const int64_t width = block_tables.size(1);
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t *ctx = context_lens.data_ptr<int64_t>(), *st = starts.data_ptr<int64_t>(),
                *len = lengths.data_ptr<int64_t>();
  std::vector<Chunk> chunks;
  for (int64_t c = 0; c < n; ++c)
    chunks.push_back(make_chunk(q, k_cache, st[c], len[c], ctx[c], tables + c * width, width,
                                window));
  // Two chunks writing the same rows of the output would race on them.
  std::vector<const Chunk*> by_start;
  for (const Chunk& chunk : chunks) by_start.push_back(&chunk);
  std::sort(by_start.begin(), by_start.end(),
            [](const Chunk* a, const Chunk* b) { return a->start < b->start; });
  for (size_t i = 1; i < by_start.size(); ++i)
    TORCH_CHECK(by_start[i]->start >= by_start[i - 1]->start + by_start[i - 1]->shape.n,
                "paged_prefill_attention_chunks: two chunks share rows of q");
  return run_chunks(q, k_cache, v_cache, chunks, scale);
}
#endif  // PREFILL_TASK_ONLY
