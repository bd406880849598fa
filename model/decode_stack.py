"""A decode step's decoder layers in one C++ call (model/kernels/csrc/decode_stack_cpu.cpp).

At one user a decode step on a CPU is a few hundred small calls: per layer two fused norms,
four matmuls, RoPE, the K/V write, attention and the activation, each reached through a
module call, reshapes and argument parsing in Python. `DecodeStack` holds every layer's
weights and K/V pool in a C++ object built once, and runs the same kernels in the same
order from C++, so the step pays one Python call for all its layers. The embedding, the
final norm and the LM head stay the model's own (one call each).

It computes exactly what the model's forward computes (the same kernels on the same
buffers: the logits are equal, tests/model/test_decode_stack.py), and only where that is
so: a Llama-family model (Llama, Qwen2's q/k/v biases included; not Qwen3's q/k norms, not
Gemma 3) whose matmuls all run on our CPU kernels (packed fp32/bf16, every GGUF code form,
with float32 or int8 activations, a fused module's parts of different types one after the
other) and whose small ops are fused, with attention through the paged-cache
kernel, for steps where every row is one token of a sequence (decode steps, and the drafts
of speculative decoding). Everything else runs the model's forward as before.
"""

from __future__ import annotations

from torch import Tensor, nn

from kvcache.pool import KVCachePool
from model.attention.metadata import StepMetadata
from model.dense_linear import PackedLinear
from model.kernels.build import load_cpu_kernels
from model.layers import BiasedLinear
from model.weights.quantized import PartsLinear, QuantizedLinear

# The kernel behind each part of a linear layer, as decode_stack.h numbers them: dense, or a
# quantized form (with "-int8" its int8-activation kernel).
KINDS = {"dense": 0, "Q4_1": 1, "Q8_0": 2, "Q4_1-int8": 3, "Q5_0": 4, "Q4_K": 5, "Q5_K": 6,
         "Q6_K": 7, "F16": 8, "BF16": 9, "Q8_0-int8": 10}

PartSpec = tuple[int, Tensor, int]  # (kind, packed weight, out features)


def part_spec(module: nn.Module) -> PartSpec | None:
    if isinstance(module, PackedLinear) and module.uses_kernel:
        return KINDS["dense"], module.packed, module.out_features
    if isinstance(module, QuantizedLinear):
        kind = f"{module.kind}-int8" if module.activations == "int8" else module.kind
        return KINDS[kind], module.packed, module.out_features
    return None


def linear_spec(module: nn.Module) -> tuple[list[PartSpec], Tensor | None] | None:
    """(parts, bias) of a layer our kernels compute; None for one they do not (a PyTorch
    matmul)."""
    bias = None
    if isinstance(module, BiasedLinear):
        module, bias = module.linear, module.bias
    parts = [part_spec(p) for p in (module.parts if isinstance(module, PartsLinear)
                                    else [module])]
    return None if None in parts else (parts, bias)


def unsupported(model: nn.Module) -> str | None:
    """Why this model's layers cannot run as one stack; None if they can."""
    cfg = getattr(model, "cfg", None)
    if cfg is None or cfg.model_type not in ("llama", "qwen2"):
        return f"architecture {getattr(cfg, 'model_type', type(model).__name__)}"
    if getattr(cfg, "qk_norm", False):
        return "q/k norms"
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if attn.fused is None or mlp.fused is None or layer.input_layernorm.fused is None:
            return "the fused small ops are not built"
        for name, linear in (("qkv", attn.qkv_proj), ("o_proj", attn.o_proj),
                             ("gate_up", mlp.gate_up_proj), ("down", mlp.down_proj)):
            if linear_spec(linear) is None:
                return f"{name} runs on PyTorch's matmul"
    return None


class DecodeStack:
    """The model's layers as one C++ object; called like the model on a decode step."""

    def __init__(self, model: nn.Module, native: object) -> None:
        self.model = model
        self.native = native  # holds the layers' weights and their K/V pool

    @classmethod
    def build(cls, model: nn.Module, pool: KVCachePool) -> DecodeStack | None:
        """The stack for this model and pool, or None where `unsupported` says why not."""
        kernels = load_cpu_kernels()
        if kernels is None or unsupported(model) is not None:
            return None
        cfg = model.cfg
        native = kernels.DecodeStack(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                                     cfg.rms_norm_eps)
        for i, layer in enumerate(model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            qkv, qkv_bias = linear_spec(attn.qkv_proj)
            (o, _), (gate_up, _), (down, _) = (linear_spec(m) for m in (
                attn.o_proj, mlp.gate_up_proj, mlp.down_proj))
            native.add_layer(layer.input_layernorm.weight, qkv, qkv_bias, o,
                             layer.post_attention_layernorm.weight, gate_up, down,
                             pool.k[i], pool.v[i])
        return cls(model, native)

    def __call__(self, input_ids: Tensor, positions: Tensor, step: StepMetadata,
                 logits_indices: Tensor | None = None) -> Tensor:
        """Logits, as model(input_ids, positions, attention, logits_indices) gives them, for
        a step whose rows are all single tokens (step.num_single == len(input_ids))."""
        assert not step.chunks and step.num_single == input_ids.numel(), "decode rows only"
        model = self.model
        rotary = model.rotary
        out, residual = self.native.forward(
            model.embed_tokens(input_ids), rotary.cos[positions], rotary.sin[positions],
            step.slot_mapping, step.single_block_tables, step.single_context_lens)
        if logits_indices is not None:
            out, residual = out[logits_indices], residual[logits_indices]
        x, _ = model.norm(out, residual)
        return model.lm_head(x)
