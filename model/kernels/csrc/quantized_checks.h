// The quantized matmuls' check of their packed weights against x (quantized_kernel.h's and
// q4_1_int8act_cpu.cpp's entry points): contiguous uint8 [groups, blocks, block_bytes], K = 32
// inputs a block, and groups of 16 output rows that hold the n outputs. Built for no particular
// target: include it before a file's target pragma.
#pragma once

#include "kernel_api.h"

#include <cstdint>

namespace quantized_checks {
namespace {

inline void check_packed(const at::Tensor& x, const at::Tensor& packed, int64_t n,
                         int64_t block_bytes, const char* name, int64_t unit_inputs = 32) {
  TORCH_CHECK(packed.dtype() == at::kByte && packed.dim() == 3 && packed.is_contiguous() &&
                  packed.size(2) == block_bytes,
              name, ": packed weights must be contiguous uint8 [groups, blocks, ", block_bytes,
              "]");
  TORCH_CHECK(x.size(1) == packed.size(1) * unit_inputs, name, ": x has ", x.size(1),
              " inputs, weights ", packed.size(1) * unit_inputs);
  const int64_t groups = packed.size(0);
  TORCH_CHECK(n > (groups - 1) * 16 && n <= groups * 16, name, ": ", n, " outputs do not fit ",
              groups, " groups of 16 rows");
}

}  // namespace
}  // namespace quantized_checks
