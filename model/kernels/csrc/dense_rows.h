// How the dense GEMM cuts many rows (dense_linear.cpp, dense_linear_avx2.cpp): into row groups
// whose x fits a share of L2, each walked over all of a thread's panels before the next, and
// each group into row blocks of at most MR rows (a tile's accumulators), all of near-equal
// size. Which group or block a row falls in never changes its sums.
#pragma once

#include <algorithm>
#include <cstdint>

// Internal linkage, as dense_prefetch.h: each file compiles its own copy for its own target.
namespace dense_rows {
namespace {

struct Groups {
  int64_t count;    // row groups
  int64_t largest;  // rows in the largest
  int64_t blocks;   // row blocks of the largest
};

// M rows of `row_bytes` each in groups of at most `bytes` of x (0: one group), but never
// fewer than four row blocks of `most` rows each.
inline Groups groups(int64_t M, int64_t row_bytes, int64_t bytes, int64_t most) {
  const int64_t rows = bytes > 0 ? std::max<int64_t>(4 * most, bytes / row_bytes) : M;
  const int64_t count = (M + rows - 1) / rows;
  const int64_t largest = (M + count - 1) / count;
  return {count, largest, (largest + most - 1) / most};
}

// Group g of `count`: its first row, its rows, and its row blocks (`base` rows each, the
// first `extra` one more: 8 rows -> 4 + 4, not 6 + 2).
struct Group {
  int64_t first, rows, blocks, base, extra;

  int64_t block_rows(int64_t b) const { return base + (b < extra ? 1 : 0); }
};

inline Group group(int64_t M, int64_t count, int64_t g, int64_t most) {
  const int64_t first = M * g / count, rows = M * (g + 1) / count - first;
  const int64_t blocks = (rows + most - 1) / most;
  return {first, rows, blocks, rows / blocks, rows % blocks};
}

}  // namespace
}  // namespace dense_rows
