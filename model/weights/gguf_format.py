"""The GGUF weight format (`--weights gguf`, the default for a GGUF file; `q4_1` is its
older name): every matrix on its own codes, exact to the fp32 model.

On a GGUF file (any architecture here): the checkpoint's matrices come as codes in our kernels'
forms (model/gguf/checkpoint.py, model/gguf/codes.py); each linear layer is built on them
(model/weights/quantized.py), the LM head too, and the embedding is looked up in its codes.
On the default model's folder: its config with the tensors of its Q4_1 GGUF, fetched once
(model/gguf/llama_codes.py). `quantize_model_q4_1(model, gguf_path)` swaps a loaded fp32
model's layers for these by the same walk (model/checkpoint.py) and drops the fp32 weights.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import torch
from torch import Tensor, nn

from model.checkpoint import Checkpoint
from model.config import ModelConfig
from model.kernels.build import load_fused_ops
from model.layers import BiasedLinear, use_fused_ops
from model.llama import LlamaModel
from model.weights.blocks import BlockTensor
from model.weights.quantized import (
    INT8_ACTIVATION_KINDS,
    PartsLinear,
    QuantizedEmbedding,
    QuantizedLinear,
    check_activations,
)


def refuse_gguf_file(path: Path, weights: str) -> None:
    if path.is_file():
        raise ValueError(f"--weights {weights} quantizes a Hugging Face folder; a GGUF file "
                         "runs on its own codes: drop --weights")


class GGUFWeights:
    """`--weights gguf` as a weight format (model/checkpoint.py).

    On a GGUF file (any architecture): every matrix of a quantized or 16-bit type
    (model/gguf/codes.py KERNEL_TYPES) runs on its own codes, a Q4_1 or Q8_0 one with
    `activations`; only a matrix stored as F32 runs on fp32 weights (the log names it); the
    embedding is looked up in its codes.

    On a folder: its config, the tensors of its GGUF (default: the default model's, fetched
    once), each linear layer and the LM head on the GGUF's own codes, the embedding read from
    the head's codes. Exact either way: the same weights, summed in another order."""

    def __init__(self, activations: str = "float32", fused_ops: bool = True,
                 gguf_path: str | Path | None = None) -> None:
        check_activations(activations)  # the kernel, before anything is read
        self.activations, self.fused_ops, self.gguf_path = activations, fused_ops, gguf_path
        self.tensor_types: dict[str, str] | None = None  # a GGUF file's, once read
        self.dequantized: list[str] = []  # what runs on fp32 weights, for the log

    def codes(self, cfg: ModelConfig, num_layers: int | None = None) -> Checkpoint:
        """The GGUF's codes as the checkpoint of a model of `cfg` with `num_layers` layers
        (default: the config's)."""
        from model.gguf.llama_codes import read_gguf_codes
        from model.prepare import fetch_default_gguf

        path = Path(self.gguf_path or fetch_default_gguf())
        codes = read_gguf_codes(path)
        num_layers = cfg.num_layers if num_layers is None else num_layers
        if codes.num_layers != num_layers:
            raise ValueError(f"GGUF has {codes.num_layers} layers, the model {num_layers}")
        return Checkpoint(cfg, codes.tensors, path)

    def read(self, path: Path) -> Checkpoint:
        if path.is_file():
            from model.gguf.checkpoint import read_gguf_checkpoint
            from model.gguf.codes import KERNEL_TYPES

            gguf = read_gguf_checkpoint(path, keep_codes=KERNEL_TYPES)
            self.tensor_types = gguf.tensor_types
            return Checkpoint(gguf.config, gguf.hf_weights, path)
        return self.codes(ModelConfig.from_dir(path))

    def check(self, cfg: ModelConfig) -> None:
        if cfg.model_type != "llama" and self.tensor_types is None:
            raise ValueError(f"--weights q4_1 runs Llama models from a folder (or any GGUF "
                             f"file), not {cfg.model_type}")

    def linear(self, name: str, module: nn.Module, weights: list,
               biases: list | None) -> nn.Module:
        if biases is not None and self.tensor_types is None:
            raise ValueError(f"--weights q4_1 has no biases for {name}")
        inner = module.linear if isinstance(module, BiasedLinear) else module
        expected = tuple(inner.weight_t.shape[::-1])  # our Linear keeps [in, out]
        if all(isinstance(w, BlockTensor) for w in weights):
            built = self.codes_linear(name, weights, expected)
        else:  # a matrix the file stores as F32: its own values, on our dense GEMM
            self.dequantized.append(name)
            dense = [w.dequantize() if isinstance(w, BlockTensor) else w for w in weights]
            inner.load_state_dict({"weight_t": torch.cat(dense).t().contiguous()},
                                  assign=True, strict=True)
            built = inner
        if biases is None:
            return built
        module.linear = built
        module.bias = nn.Parameter(torch.cat(biases), requires_grad=False)
        return module

    def codes_linear(self, name: str, weights: list[BlockTensor],
                     expected: tuple[int, int]) -> nn.Module:
        """One kernel over the fused codes where the parts share a form, else a kernel per
        part (PartsLinear)."""
        from model.gguf.codes import fuse

        rows, cols = sum(w.rows for w in weights), weights[0].cols
        if (rows, cols) != expected or any(w.cols != cols for w in weights):
            raise ValueError(f"GGUF tensor for {name} is {rows}x{cols}, the model's is "
                             f"{expected[0]}x{expected[1]}: not the same model")

        def layer(weight: BlockTensor) -> QuantizedLinear:
            acts = self.activations if weight.kind in INT8_ACTIVATION_KINDS else "float32"
            return QuantizedLinear(weight, acts)

        fused = fuse(weights)
        return layer(fused) if fused is not None else PartsLinear([layer(w) for w in weights])

    def embedding_and_head(self, model: nn.Module, embedding: BlockTensor | Tensor,
                           head: BlockTensor | Tensor | None) -> None:
        """The head on its codes (a Q4_1 or Q8_0 head takes the layers' activations); the
        embedding looked up in its codes: a tied one in the head's, an untied one in its
        own blocks. Only an embedding the file stores as F32 is kept as fp32 rows."""
        model.lm_head = self.linear("lm_head", model.lm_head,
                                    [embedding if head is None else head], None)
        if not isinstance(embedding, BlockTensor):
            model.embed_tokens.load_state_dict({"weight": embedding}, assign=True, strict=True)
        elif head is None and isinstance(model.lm_head, QuantizedLinear):
            model.embed_tokens = QuantizedEmbedding(head=model.lm_head)  # one set of codes
        else:  # a copy: a view would keep the whole file mapped
            model.embed_tokens = QuantizedEmbedding(blocks=BlockTensor(
                embedding.kind, embedding.blocks.clone()))

    def finish(self, model: nn.Module) -> nn.Module:
        if self.fused_ops:
            use_fused_ops(model, load_fused_ops())
        if self.tensor_types is not None:
            report_and_pack(model, self.dequantized, self.tensor_types)
        return model.eval().requires_grad_(False)


def quantize_model_q4_1(model: LlamaModel, gguf_path: str | Path,
                        activations: str = "float32") -> None:
    """Replace a loaded fp32 model's linear layers, LM head and embedding with the GGUF's
    codes, dropping the fp32 weights (the norms are the GGUF's too: the same values).

    The model must be the one the GGUF was converted to (shapes are checked), on the CPU in
    float32, with PyTorch's matmuls (matmul="torch"). Attribute names stay:
    layers[i].self_attn.qkv_proj, o_proj, layers[i].mlp.gate_up_proj, down_proj, lm_head,
    embed_tokens."""
    from model.checkpoint import load_weights
    from model.registry import architecture

    weight = model.norm.weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        raise ValueError(f"--weights q4_1 runs on the CPU in float32; the model is on "
                         f"{weight.device} in {weight.dtype}")
    fmt = GGUFWeights(activations, fused_ops=False, gguf_path=gguf_path)
    checkpoint = fmt.codes(model.cfg, num_layers=len(model.layers))
    load_weights(model, architecture(model.cfg.model_type), checkpoint, fmt)


def report_and_pack(model: nn.Module, dequantized: list[str], types: dict[str, str]) -> None:
    """Log what a GGUF file's matrices run on (the kernels by form, the modules on fp32
    weights with the types they came from); pack those for our dense GEMM."""
    from model.registry import architecture

    log = logging.getLogger("nano_vllm.kernel")
    kinds = Counter(m.kind for m in model.modules() if isinstance(m, QuantizedLinear))
    log.info("a %s GGUF on its own codes: %s", model.cfg.model_type,
             ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
    if not dequantized:
        return
    from model.dense_linear import pack_model_linears

    arch = architecture(model.cfg.model_type)

    def source(name: str) -> str:
        parts = arch.checkpoint_modules(name, model.cfg)
        return "/".join(types.get(f"{part}.weight", "?") for part in parts)

    log.info("on fp32 weights (stored so, or mixing F32 with codes): %s",
             ", ".join(f"{name} ({source(name)})" for name in dequantized))
    pack_model_linears(model)
