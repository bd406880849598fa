"""The dense weight format (`--weights dense`, a folder's default): the checkpoint's tensors
as they are (fp32, bf16, or a GGUF file dequantized to fp32), fused and transposed into our
Linear layers, moved to the device in --dtype, our CPU kernels switched in where they run."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import Tensor, nn

from model.checkpoint import Checkpoint, read_checkpoint
from model.config import ModelConfig
from model.dense_linear import pack_model_linears
from model.kernels.build import load_fused_ops
from model.layers import BiasedLinear, Linear, log_torch_pieces, use_fused_ops
from model.weights.blocks import BlockTensor

log = logging.getLogger("nano_vllm.kernel")

CPU_KERNEL_DTYPES = (torch.float32, torch.bfloat16)
MATMULS = ("auto", "torch")
LM_HEADS = ("default", "q8_0")


def transposed(*weights: Tensor) -> Tensor:
    """nn.Linear weights [out, in], fused along out, as our Linear's [in, out]."""
    return torch.cat(weights).t().contiguous()


class DenseWeights:
    """`--weights default`: the checkpoint's tensors as they are (fp32, bf16, or a GGUF
    dequantized to fp32), fused and transposed into our Linear layers, then moved to
    `device` in `dtype`. On a CPU, where our kernels can be built and run: with fused_ops,
    the small ops between the matmuls run compiled (model/layers.py); with matmul "auto",
    the linear layers' weights are packed once for our own GEMM kernel
    (model/dense_linear.py); "torch" keeps PyTorch's matmuls.

    lm_head "q8_0" (CPU, float32) runs the LM head on the Q8_0 kernel of model/weights/quantized.py:
    on a GGUF file's own codes where its head (or tied embedding) is stored as Q8_0 (exact to
    the dequantized model up to summation order; a tied embedding then reads its rows from
    the same codes), else on Q8_0 codes made at load (model/weights/int8.py `q8_0_blocks`; not
    exact, the embedding keeps its own weights)."""

    def __init__(self, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 fused_ops: bool = True, matmul: str = "auto", lm_head: str = "default") -> None:
        if matmul not in MATMULS:
            raise ValueError(f"unknown matmul {matmul!r}; choose one of {', '.join(MATMULS)}")
        if lm_head not in LM_HEADS:
            raise ValueError(f"unknown lm_head {lm_head!r}; choose one of {', '.join(LM_HEADS)}")
        self.device, self.dtype = torch.device(device), dtype
        self.fused_ops, self.matmul, self.lm_head = fused_ops, matmul, lm_head
        if lm_head == "q8_0":
            from model.weights.quantized import quantized_kernels

            if self.device.type != "cpu" or dtype != torch.float32:
                raise ValueError("--lm-head q8_0 runs on the CPU in float32: drop --dtype / "
                                 "--device")
            quantized_kernels()  # the kernel, before anything is read

    def read(self, path: Path) -> Checkpoint:
        checkpoint = read_checkpoint(path)
        if self.lm_head == "q8_0" and path.is_file():  # the GGUF's own head codes, if Q8_0
            from model.gguf.checkpoint import hf_name
            from model.gguf.llama_codes import read_gguf_block_tensor

            name = "token_embd.weight" if checkpoint.config.tie_word_embeddings else "output.weight"
            codes = read_gguf_block_tensor(path, name)
            if codes is not None and codes.kind == "Q8_0":
                checkpoint.tensors[hf_name(name, "")] = codes
        return checkpoint

    def check(self, cfg: ModelConfig) -> None:
        pass

    def linear(self, name: str, module: Linear | BiasedLinear, weights: list,
               biases: list | None) -> nn.Module:
        if isinstance(module, BiasedLinear):
            assert biases is not None
            module.load_state_dict({"linear.weight_t": transposed(*weights),
                                    "bias": torch.cat(biases)}, assign=True, strict=True)
        else:
            module.load_state_dict({"weight_t": transposed(*weights)}, assign=True, strict=True)
        return module

    def embedding_and_head(self, model: nn.Module, embedding: Tensor | BlockTensor,
                           head: Tensor | BlockTensor | None) -> None:
        """A tied head is a transposed copy of the embedding (the lookup wants rows, the
        matmul [in, out]); pack_model_linears drops that copy again."""
        if model.lm_head is None:  # an encoder: the embedding alone
            model.embed_tokens.load_state_dict({"weight": embedding}, assign=True, strict=True)
            return
        if self.lm_head == "q8_0":
            self.q8_0_head(model, embedding, head)
            return
        model.embed_tokens.load_state_dict({"weight": embedding}, assign=True, strict=True)
        model.lm_head.load_state_dict(
            {"weight_t": transposed(embedding if head is None else head)}, assign=True)

    def q8_0_head(self, model: nn.Module, embedding: Tensor | BlockTensor,
                  head: Tensor | BlockTensor | None) -> None:
        from model.weights.int8 import q8_0_blocks
        from model.weights.quantized import QuantizedEmbedding, QuantizedLinear

        source = embedding if head is None else head
        model.lm_head = QuantizedLinear(source if isinstance(source, BlockTensor)
                                        else q8_0_blocks(source))
        if isinstance(embedding, BlockTensor):  # tied, the file's codes: share them
            model.embed_tokens = QuantizedEmbedding(model.lm_head)
        else:
            model.embed_tokens.load_state_dict({"weight": embedding}, assign=True, strict=True)

    def finish(self, model: nn.Module) -> nn.Module:
        model = model.to(device=self.device, dtype=self.dtype).eval().requires_grad_(False)
        on_cpu = self.device.type == "cpu" and self.dtype in CPU_KERNEL_DTYPES
        if self.fused_ops and on_cpu:
            use_fused_ops(model, load_fused_ops())
        if self.matmul == "auto" and on_cpu:
            pack_model_linears(model)
        if (self.fused_ops or self.matmul == "auto") and on_cpu:
            log_torch_pieces(model.cfg)
        return model
