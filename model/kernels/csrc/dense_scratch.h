// Scratch memory of the dense GEMM's paths, reused from call to call: a decode step makes
// about 120 matmul calls, and a fresh vector per call (allocated and zeroed) cost each one
// microseconds of memset and malloc for buffers that every call overwrites before it reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dense_scratch {

// kPartial: sums; kWide: widened weights; kX: x widened to fp32, or AMX's padded last rows.
enum Slot { kPartial, kWide, kX, kSlots };

// At least `n` floats, 64-byte aligned, of the calling thread's buffer `slot`, kept and only
// ever grown between calls: it holds whatever its last user left there (and a long prefill
// chunk's size stays allocated: a few MB at most for this engine's shapes).
inline float* floats(Slot slot, size_t n) {
  thread_local std::vector<float> buffers[kSlots];
  std::vector<float>& buffer = buffers[slot];
  if (buffer.size() < n + 16) buffer.resize(n + 16);
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buffer.data()) + 63) &
                                  ~uintptr_t{63});
}

}  // namespace dense_scratch
