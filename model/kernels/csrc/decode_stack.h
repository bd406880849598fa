// Every decoder layer of a Llama-family model for one decode step, in one call from Python:
// the class bindings.cpp exposes as DecodeStack, and the layers it holds. decode_stack_cpu.cpp
// runs it (and says why it exists).
#pragma once

#include "kernel_api.h"

#include <c10/util/Optional.h>

#include <cstdint>
#include <tuple>
#include <vector>

namespace decode_stack {

// Which kernel computes a linear layer's part (model/decode_stack.py KINDS names them).
enum LinearKind : int64_t {
  kDense = 0, kQ4_1 = 1, kQ8_0 = 2, kQ4_1Int8Act = 3, kQ5_0 = 4, kQ4_K = 5, kQ5_K = 6,
  kQ6_K = 7, kF16 = 8, kBF16 = 9, kQ8_0Int8Act = 10, kLastKind = 10
};

// One kernel over one packed matrix.
struct Part {
  int64_t kind;
  at::Tensor packed;
  int64_t out_features;

  at::Tensor operator()(const at::Tensor& x) const;
};

// A linear layer: one part, or (a GGUF file's fused module of mixed types) several whose
// outputs sit side by side.
struct Linear {
  std::vector<Part> parts;
  at::Tensor bias;  // undefined: none

  at::Tensor operator()(const at::Tensor& x) const;
};

// (kind, packed weight, out features) of each part, as Python hands them over.
using PartSpecs = std::vector<std::tuple<int64_t, at::Tensor, int64_t>>;

struct Layer {
  at::Tensor input_norm, post_norm;
  Linear qkv, o, gate_up, down;
  at::Tensor k_slots, v_slots;  // the layer's pool, [blocks * block_size, kv_heads, dim]
  at::Tensor k_cache, v_cache;  // the same memory, [blocks, block_size, kv_heads, dim]
};

}  // namespace decode_stack

class DecodeStack {
 public:
  DecodeStack(int64_t heads, int64_t kv_heads, int64_t head_dim, double eps)
      : heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), eps_(eps) {}

  // Layers are added in order; each linear is its parts (and QKV's bias).
  void add_layer(at::Tensor input_norm, const decode_stack::PartSpecs& qkv,
                 c10::optional<at::Tensor> qkv_bias, const decode_stack::PartSpecs& o,
                 at::Tensor post_norm, const decode_stack::PartSpecs& gate_up,
                 const decode_stack::PartSpecs& down, at::Tensor k_cache, at::Tensor v_cache);

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

  // x: the embeddings [tokens, hidden]; cos, sin: [tokens, head_dim]; token i is the newest
  // of sequence i, which goes to slot_mapping[i] and attends over context_lens[i] tokens
  // through block_tables[i]. Returns the last layer's output and the residual stream, the
  // two the model's final norm adds together.
  std::tuple<at::Tensor, at::Tensor> forward(at::Tensor x, at::Tensor cos, at::Tensor sin,
                                             at::Tensor slot_mapping, at::Tensor block_tables,
                                             at::Tensor context_lens) const;

 private:
  int64_t heads_, kv_heads_, head_dim_;
  double eps_;
  std::vector<decode_stack::Layer> layers_;
};
