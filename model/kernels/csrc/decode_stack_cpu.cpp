// Every decoder layer of a Llama-family model for one decode step, in one call from Python.
//
// A decode step of one user runs ~30 small kernels per layer, and from Python each one
// costs its dispatch (module call, reshapes, argument parsing) on top of its work: about a
// tenth of the step at one user. Here the same kernels run in the same order on the same
// buffers, called from C++: RMSNorm with the residual add, the QKV matmul, RoPE in place,
// the K/V written into their slots, attention over the paged cache, the output projection,
// the second norm, gate/up, SiLU * up and down. The arithmetic is the Python path's, op for
// op, so the logits are the same bits (tests/model/test_decode_stack.py).
//
// Only steps where every row is one token of its own sequence come here (the engine's
// decode steps); prefill chunks, sliding windows and the variants some architectures add
// (q/k norms, Gemma's norms) stay on the Python path, model/decode_stack.py decides.
#include "decode_stack.h"

#include <ATen/ops/cat.h>

#include <cmath>
#include <cstring>
#include <utility>

at::Tensor dense_linear(at::Tensor x, at::Tensor packed, int64_t n, int64_t threads);
at::Tensor q4_1_linear(at::Tensor x, at::Tensor packed, int64_t out_features);
at::Tensor q8_0_linear(at::Tensor x, at::Tensor packed, int64_t out_features);
at::Tensor q4_1_int8act_linear(at::Tensor x, at::Tensor packed, int64_t out_features);
at::Tensor q8_0_int8act_linear(at::Tensor x, at::Tensor packed, int64_t out_features);
at::Tensor q5_0_linear(at::Tensor x, at::Tensor packed, int64_t out_features);
at::Tensor q4_k_linear(at::Tensor x, at::Tensor packed, int64_t out_features);
at::Tensor q5_k_linear(at::Tensor x, at::Tensor packed, int64_t out_features);
at::Tensor q6_k_linear(at::Tensor x, at::Tensor packed, int64_t out_features);
at::Tensor f16_linear(at::Tensor x, at::Tensor packed, int64_t out_features);
at::Tensor bf16_linear(at::Tensor x, at::Tensor packed, int64_t out_features);
at::Tensor add_rms_norm(at::Tensor residual, at::Tensor delta, at::Tensor weight,
                        double eps);
void rope_inplace(at::Tensor qk, int64_t heads, at::Tensor cos, at::Tensor sin);
at::Tensor silu_mul(at::Tensor gate_up);
at::Tensor paged_decode_attention(at::Tensor q, at::Tensor k_cache,
                                  at::Tensor v_cache, at::Tensor block_tables,
                                  at::Tensor context_lens, double scale, int64_t window);

namespace decode_stack {

at::Tensor Part::operator()(const at::Tensor& x) const {
  switch (kind) {
    case kDense: return dense_linear(x, packed, out_features, 0);
    case kQ4_1: return q4_1_linear(x, packed, out_features);
    case kQ8_0: return q8_0_linear(x, packed, out_features);
    case kQ4_1Int8Act: return q4_1_int8act_linear(x, packed, out_features);
    case kQ5_0: return q5_0_linear(x, packed, out_features);
    case kQ4_K: return q4_k_linear(x, packed, out_features);
    case kQ5_K: return q5_k_linear(x, packed, out_features);
    case kQ6_K: return q6_k_linear(x, packed, out_features);
    case kF16: return f16_linear(x, packed, out_features);
    case kBF16: return bf16_linear(x, packed, out_features);
    case kQ8_0Int8Act: return q8_0_int8act_linear(x, packed, out_features);
    default: TORCH_CHECK(false, "decode stack: unknown linear kind ", kind);
  }
}

at::Tensor Linear::operator()(const at::Tensor& x) const {
  at::Tensor y;
  if (parts.size() == 1) {
    y = parts[0](x);
  } else {
    std::vector<at::Tensor> outs;
    outs.reserve(parts.size());
    for (const Part& part : parts) outs.push_back(part(x));
    y = at::cat(outs, 1);
  }
  return bias.defined() ? y.add_(bias) : y;
}

}  // namespace decode_stack

namespace {

using namespace decode_stack;  // Layer, Linear, LinearKind

// Row i's K (or V) part of qkv, `width` values from column `from`, into row slots[i] of the
// layer's pool: the copy index_copy_ makes, without its set-up on every call (two calls a
// layer). The caller checks the slots, dtypes and layouts.
void write_slots(const at::Tensor& pool_slots, const at::Tensor& qkv, int64_t from,
                 int64_t width, const int64_t* slots, int64_t tokens) {
  const int64_t elt = qkv.element_size();
  const char* src = static_cast<const char*>(qkv.data_ptr()) + from * elt;
  char* dst = static_cast<char*>(pool_slots.data_ptr());
  const int64_t row = qkv.stride(0) * elt;
  for (int64_t i = 0; i < tokens; ++i)
    std::memcpy(dst + slots[i] * width * elt, src + i * row, width * elt);
}

Linear make_linear(const PartSpecs& specs, c10::optional<at::Tensor> bias) {
  TORCH_CHECK(!specs.empty(), "decode stack: a linear layer needs a part");
  Linear linear{{}, bias.value_or(at::Tensor())};
  for (const auto& [kind, packed, out_features] : specs) {
    TORCH_CHECK(kind >= kDense && kind <= kLastKind, "decode stack: unknown linear kind ", kind);
    linear.parts.push_back(Part{kind, packed, out_features});
  }
  return linear;
}

int64_t out_width(const Linear& linear) {
  int64_t width = 0;
  for (const Part& part : linear.parts) width += part.out_features;
  return width;
}

}  // namespace

void DecodeStack::add_layer(at::Tensor input_norm, const PartSpecs& qkv,
                            c10::optional<at::Tensor> qkv_bias, const PartSpecs& o,
                            at::Tensor post_norm, const PartSpecs& gate_up,
                            const PartSpecs& down, at::Tensor k_cache, at::Tensor v_cache) {
  Linear qkv_linear = make_linear(qkv, qkv_bias);
  TORCH_CHECK(out_width(qkv_linear) == (heads_ + 2 * kv_heads_) * head_dim_,
              "decode stack: QKV width ", out_width(qkv_linear), " does not match the heads");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.size(2) == kv_heads_ && k_cache.size(3) == head_dim_
                  && k_cache.is_contiguous() && v_cache.sizes() == k_cache.sizes(),
              "decode stack: K/V pool must be [blocks, block_size, kv_heads, head_dim]");
  layers_.push_back(Layer{
      input_norm, post_norm, std::move(qkv_linear), make_linear(o, c10::nullopt),
      make_linear(gate_up, c10::nullopt), make_linear(down, c10::nullopt),
      k_cache.view({-1, kv_heads_, head_dim_}), v_cache.view({-1, kv_heads_, head_dim_}),
      k_cache, v_cache});
}

std::tuple<at::Tensor, at::Tensor> DecodeStack::forward(at::Tensor x, at::Tensor cos,
                                                        at::Tensor sin, at::Tensor slot_mapping,
                                                        at::Tensor block_tables,
                                                        at::Tensor context_lens) const {
  TORCH_CHECK(!layers_.empty(), "decode stack: no layers");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "decode stack: x must be [tokens, hidden]");
  const int64_t tokens = x.size(0);
  TORCH_CHECK(slot_mapping.numel() == tokens && context_lens.numel() == tokens &&
                  block_tables.size(0) == tokens,
              "decode stack: one slot, context length and block table per token");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous(),
              "decode stack: slot_mapping must be contiguous int64");
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (const Layer& layer : layers_) {
    TORCH_CHECK(layer.k_slots.scalar_type() == x.scalar_type() &&
                    layer.v_slots.scalar_type() == x.scalar_type(),
                "decode stack: the K/V pool's dtype must be the activations'");
    for (int64_t i = 0; i < tokens; ++i)
      TORCH_CHECK(slots[i] >= 0 && slots[i] < layer.k_slots.size(0),
                  "decode stack: slot ", slots[i], " is outside the pool");
  }
  const int64_t q_width = heads_ * head_dim_, kv_width = kv_heads_ * head_dim_;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
  at::Tensor residual = x.clone();
  at::Tensor hidden = add_rms_norm(x, x.narrow(0, 0, 0), layers_[0].input_norm, eps_);
  at::Tensor out;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& layer = layers_[i];
    if (i > 0) hidden = add_rms_norm(residual, out, layer.input_norm, eps_);
    at::Tensor qkv = layer.qkv(hidden);
    rope_inplace(qkv.narrow(1, 0, q_width + kv_width), heads_ + kv_heads_, cos, sin);
    TORCH_CHECK(qkv.stride(1) == 1 && qkv.scalar_type() == x.scalar_type(),
                "decode stack: QKV rows must be contiguous, in the activations' dtype");
    write_slots(layer.k_slots, qkv, q_width, kv_width, slots, tokens);
    write_slots(layer.v_slots, qkv, q_width + kv_width, kv_width, slots, tokens);
    at::Tensor q = qkv.narrow(1, 0, q_width).view({tokens, heads_, head_dim_});
    at::Tensor attended = paged_decode_attention(q, layer.k_cache, layer.v_cache,
                                                 block_tables, context_lens, scale, 0);
    out = layer.o(attended.view({tokens, q_width}));
    hidden = add_rms_norm(residual, out, layer.post_norm, eps_);
    out = layer.down(silu_mul(layer.gate_up(hidden)));
  }
  return {out, residual};
}
