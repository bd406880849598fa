// The dense GEMM's prefetch, shared by its AVX-512 path (dense_linear.cpp) and its AVX2 path
// (dense_linear_avx2.cpp): while one chunk of a thread's weight stream is computed, the lines
// `distance` bytes further on are requested, shared out among the calls that compute the
// chunk and spread over each call's steps.
#pragma once

#include <xmmintrin.h>

#include <algorithm>
#include <cstdint>

// Internal linkage: each file compiles its own copy for its own target (the files' target
// pragmas differ, and one shared inline copy could carry AVX-512 code into the AVX2 path).
namespace dense_prefetch {
namespace {

// What to request during one chunk: `lines` cache lines from `start`.
struct Window {
  const char* start;
  int64_t lines;

  // The share of call i of the n that compute the chunk: its first line ...
  const char* part_start(int64_t i, int64_t n) const { return start + 64 * (lines * i / n); }
  // ... and how many lines it requests.
  int64_t part_lines(int64_t i, int64_t n) const { return lines * (i + 1) / n - lines * i / n; }
};

// The window of the chunk that starts `offset` bytes into a `total`-byte stream and spans
// `chunk_lines` cache lines: as many lines, `distance` bytes on, never past the stream's end
// (none when distance is 0).
inline Window window(const char* stream, int64_t total, int64_t offset, int64_t distance,
                     int64_t chunk_lines) {
  const int64_t left = total - offset - distance;
  const int64_t lines = distance > 0 ? std::clamp<int64_t>(left / 64, 0, chunk_lines) : 0;
  return {lines > 0 ? stream + offset + distance : stream, lines};
}

// Called once in each of a call's `steps` steps: requests that step's share of `lines` lines
// from `pf` on, evenly spread (Bresenham); `due` (start at 0) and `pf` carry between steps.
inline void spread(int64_t& due, const char*& pf, int64_t lines, int64_t steps) {
  for (due += lines; due >= steps; due -= steps, pf += 64) _mm_prefetch(pf, _MM_HINT_T0);
}

}  // namespace
}  // namespace dense_prefetch
