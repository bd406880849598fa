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
#include <torch/extension.h>

#include <cstring>
#include <vector>

torch::Tensor dense_linear(torch::Tensor x, torch::Tensor packed, int64_t n, int64_t threads);
torch::Tensor q4_1_linear(torch::Tensor x, torch::Tensor packed, int64_t out_features);
torch::Tensor q8_0_linear(torch::Tensor x, torch::Tensor packed, int64_t out_features);
torch::Tensor q4_1_int8act_linear(torch::Tensor x, torch::Tensor packed, int64_t out_features);
torch::Tensor add_rms_norm(torch::Tensor residual, torch::Tensor delta, torch::Tensor weight,
                           double eps);
void rope_inplace(torch::Tensor qk, int64_t heads, torch::Tensor cos, torch::Tensor sin);
torch::Tensor silu_mul(torch::Tensor gate_up);
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache,
                                     torch::Tensor v_cache, torch::Tensor block_tables,
                                     torch::Tensor context_lens, double scale, int64_t window);

namespace {

// Which kernel computes a linear layer (model/decode_stack.py LINEAR_KINDS names them).
enum LinearKind : int64_t { kDense = 0, kQ4_1 = 1, kQ8_0 = 2, kQ4_1Int8Act = 3 };

struct Linear {
  int64_t kind;
  torch::Tensor packed;
  int64_t out_features;
  torch::Tensor bias;  // undefined: none

  torch::Tensor operator()(const torch::Tensor& x) const {
    torch::Tensor y;
    switch (kind) {
      case kDense: y = dense_linear(x, packed, out_features, 0); break;
      case kQ4_1: y = q4_1_linear(x, packed, out_features); break;
      case kQ8_0: y = q8_0_linear(x, packed, out_features); break;
      case kQ4_1Int8Act: y = q4_1_int8act_linear(x, packed, out_features); break;
      default: TORCH_CHECK(false, "decode stack: unknown linear kind ", kind);
    }
    return bias.defined() ? y.add_(bias) : y;
  }
};

struct Layer {
  torch::Tensor input_norm, post_norm;
  Linear qkv, o, gate_up, down;
  torch::Tensor k_slots, v_slots;  // the layer's pool, [blocks * block_size, kv_heads, dim]
  torch::Tensor k_cache, v_cache;  // the same memory, [blocks, block_size, kv_heads, dim]
};

// Row i's K (or V) part of qkv, `width` values from column `from`, into row slots[i] of the
// layer's pool: the copy index_copy_ makes, without its set-up on every call (two calls a
// layer). The caller checks the slots, dtypes and layouts.
void write_slots(const torch::Tensor& pool_slots, const torch::Tensor& qkv, int64_t from,
                 int64_t width, const int64_t* slots, int64_t tokens) {
  const int64_t elt = qkv.element_size();
  const char* src = static_cast<const char*>(qkv.data_ptr()) + from * elt;
  char* dst = static_cast<char*>(pool_slots.data_ptr());
  const int64_t row = qkv.stride(0) * elt;
  for (int64_t i = 0; i < tokens; ++i)
    std::memcpy(dst + slots[i] * width * elt, src + i * row, width * elt);
}

Linear make_linear(int64_t kind, torch::Tensor packed, int64_t out_features,
                   c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(kind >= kDense && kind <= kQ4_1Int8Act, "decode stack: unknown linear kind ", kind);
  return Linear{kind, std::move(packed), out_features, bias.value_or(torch::Tensor())};
}

}  // namespace

class DecodeStack {
 public:
  DecodeStack(int64_t heads, int64_t kv_heads, int64_t head_dim, double eps)
      : heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), eps_(eps) {}

  // Layers are added in order; each linear is (kind, packed weight, out features, bias).
  void add_layer(torch::Tensor input_norm, int64_t qkv_kind, torch::Tensor qkv,
                 int64_t qkv_out, c10::optional<torch::Tensor> qkv_bias, int64_t o_kind,
                 torch::Tensor o, int64_t o_out, torch::Tensor post_norm, int64_t gate_up_kind,
                 torch::Tensor gate_up, int64_t gate_up_out, int64_t down_kind,
                 torch::Tensor down, int64_t down_out, torch::Tensor k_cache,
                 torch::Tensor v_cache) {
    TORCH_CHECK(qkv_out == (heads_ + 2 * kv_heads_) * head_dim_,
                "decode stack: QKV width ", qkv_out, " does not match the heads");
    TORCH_CHECK(k_cache.dim() == 4 && k_cache.size(2) == kv_heads_ && k_cache.size(3) == head_dim_
                    && k_cache.is_contiguous() && v_cache.sizes() == k_cache.sizes(),
                "decode stack: K/V pool must be [blocks, block_size, kv_heads, head_dim]");
    layers_.push_back(Layer{
        input_norm, post_norm, make_linear(qkv_kind, qkv, qkv_out, qkv_bias),
        make_linear(o_kind, o, o_out, c10::nullopt),
        make_linear(gate_up_kind, gate_up, gate_up_out, c10::nullopt),
        make_linear(down_kind, down, down_out, c10::nullopt),
        k_cache.view({-1, kv_heads_, head_dim_}), v_cache.view({-1, kv_heads_, head_dim_}),
        k_cache, v_cache});
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

  // x: the embeddings [tokens, hidden]; cos, sin: [tokens, head_dim]; token i is the newest
  // of sequence i, which goes to slot_mapping[i] and attends over context_lens[i] tokens
  // through block_tables[i]. Returns the last layer's output and the residual stream, the
  // two the model's final norm adds together.
  std::tuple<torch::Tensor, torch::Tensor> forward(torch::Tensor x, torch::Tensor cos,
                                                   torch::Tensor sin, torch::Tensor slot_mapping,
                                                   torch::Tensor block_tables,
                                                   torch::Tensor context_lens) const {
    TORCH_CHECK(!layers_.empty(), "decode stack: no layers");
    TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "decode stack: x must be [tokens, hidden]");
    const int64_t tokens = x.size(0);
    TORCH_CHECK(slot_mapping.numel() == tokens && context_lens.numel() == tokens &&
                    block_tables.size(0) == tokens,
                "decode stack: one slot, context length and block table per token");
    TORCH_CHECK(slot_mapping.scalar_type() == torch::kLong && slot_mapping.is_contiguous(),
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
    torch::Tensor residual = x.clone();
    torch::Tensor hidden = add_rms_norm(x, x.narrow(0, 0, 0), layers_[0].input_norm, eps_);
    torch::Tensor out;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& layer = layers_[i];
      if (i > 0) hidden = add_rms_norm(residual, out, layer.input_norm, eps_);
      torch::Tensor qkv = layer.qkv(hidden);
      rope_inplace(qkv.narrow(1, 0, q_width + kv_width), heads_ + kv_heads_, cos, sin);
      TORCH_CHECK(qkv.stride(1) == 1 && qkv.scalar_type() == x.scalar_type(),
                  "decode stack: QKV rows must be contiguous, in the activations' dtype");
      write_slots(layer.k_slots, qkv, q_width, kv_width, slots, tokens);
      write_slots(layer.v_slots, qkv, q_width + kv_width, kv_width, slots, tokens);
      torch::Tensor q = qkv.narrow(1, 0, q_width).view({tokens, heads_, head_dim_});
      torch::Tensor attended = paged_decode_attention(q, layer.k_cache, layer.v_cache,
                                                      block_tables, context_lens, scale, 0);
      out = layer.o(attended.view({tokens, q_width}));
      hidden = add_rms_norm(residual, out, layer.post_norm, eps_);
      out = layer.down(silu_mul(layer.gate_up(hidden)));
    }
    return {out, residual};
  }

 private:
  int64_t heads_, kv_heads_, head_dim_;
  double eps_;
  std::vector<Layer> layers_;
};

void bind_decode_stack(pybind11::module_& m) {
  pybind11::class_<DecodeStack>(m, "DecodeStack",
                                "every decoder layer of a decode step in one call "
                                "(decode_stack_cpu.cpp)")
      .def(pybind11::init<int64_t, int64_t, int64_t, double>(), pybind11::arg("heads"),
           pybind11::arg("kv_heads"), pybind11::arg("head_dim"), pybind11::arg("eps"))
      .def("add_layer", &DecodeStack::add_layer)
      .def("num_layers", &DecodeStack::num_layers)
      .def("forward", &DecodeStack::forward, pybind11::arg("x"), pybind11::arg("cos"),
           pybind11::arg("sin"), pybind11::arg("slot_mapping"), pybind11::arg("block_tables"),
           pybind11::arg("context_lens"));
}
