"""The one way a model comes in: a source, a checkpoint, an architecture, a weight format.

`load(source, weights=...)`:
1. the source (`--model`: nothing for the default model, a short name such as
   `gemma-3-270m`, a GGUF file or a Hugging Face folder) is found or fetched
   (model/prepare.py `resolve_model_dir`);
2. the weight format (`resolve_weights`: by default a GGUF file's own codes, a folder's
   dense weights) reads it as a checkpoint: a config and tensors under Hugging Face's names
   (a folder's safetensors, a GGUF file's codes in our kernels' forms or dequantized to
   fp32, or for gguf on the default folder its Q4_1 GGUF's codes);
3. the architecture of the config's `model_type` (model/registry.py) is built on the meta
   device and filled module by module from the checkpoint (model/checkpoint.py), each linear
   layer, the embedding and the LM head built by the weight format;
4. the format finishes the model: device and dtype, our CPU kernels.

The formats: "dense" (`DenseWeights`, below: the checkpoint's weights in --dtype), "gguf"
(model/quantized.py; "q4_1" is its older name) and "int8" (model/int8.py). `load_model`,
`load_q4_1_model` and `load_int8_model` are this path for a given folder or file.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from model.checkpoint import Checkpoint, WeightFormat, build_model, read_checkpoint
from model.config import ModelConfig
from model.cpu_kernel import load_fused_ops
from model.dense_linear import pack_model_linears
from model.gguf_weights import BlockTensor
from model.layers import BiasedLinear, Linear, use_fused_ops
from model.memory import check_fits, give_back_freed_memory
from model.registry import architecture

log = logging.getLogger("nano_vllm.kernel")
load_log = logging.getLogger("nano_vllm.engine")

CPU_KERNEL_DTYPES = (torch.float32, torch.bfloat16)
MATMULS = ("auto", "torch")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WEIGHTS = ("default", "gguf", "dense", "q4_1", "int8")  # q4_1: gguf's older name
LM_HEADS = ("default", "q8_0")


def pick_device(name: str | None = None) -> torch.device:
    """CUDA if present, else Apple MPS, else CPU; an explicit name wins."""
    if name:
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def pick_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


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

    lm_head "q8_0" (CPU, float32) runs the LM head on the Q8_0 kernel of model/quantized.py:
    on a GGUF file's own codes where its head (or tied embedding) is stored as Q8_0 (exact to
    the dequantized model up to summation order; a tied embedding then reads its rows from
    the same codes), else on Q8_0 codes made at load (model/int8.py `q8_0_blocks`; not
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
            from model.quantized import quantized_kernels

            if self.device.type != "cpu" or dtype != torch.float32:
                raise ValueError("--lm-head q8_0 runs on the CPU in float32: drop --dtype / "
                                 "--device")
            quantized_kernels()  # the kernel, before anything is read

    def read(self, path: Path) -> Checkpoint:
        checkpoint = read_checkpoint(path)
        if self.lm_head == "q8_0" and path.is_file():  # the GGUF's own head codes, if Q8_0
            from model.gguf_checkpoint import hf_name
            from model.gguf_weights import read_gguf_block_tensor

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
        if self.lm_head == "q8_0":
            self.q8_0_head(model, embedding, head)
            return
        model.embed_tokens.load_state_dict({"weight": embedding}, assign=True, strict=True)
        model.lm_head.load_state_dict(
            {"weight_t": transposed(embedding if head is None else head)}, assign=True)

    def q8_0_head(self, model: nn.Module, embedding: Tensor | BlockTensor,
                  head: Tensor | BlockTensor | None) -> None:
        from model.int8 import q8_0_blocks
        from model.quantized import QuantizedEmbedding, QuantizedLinear

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


def load_path(path: Path, fmt: WeightFormat) -> nn.Module:
    """A folder's or file's model in the weight format `fmt` (steps 2-4 of the module
    docstring)."""
    checkpoint = fmt.read(path)
    arch = architecture(checkpoint.config.model_type)
    fmt.check(checkpoint.config)
    return fmt.finish(build_model(checkpoint, arch, fmt))


@dataclass
class LoadedModel:
    model: nn.Module
    path: Path  # the folder or GGUF file the source resolved to (its tokenizer is there)


def resolve_weights(weights: str, path: Path, *, device: str | None = None,
                    dtype: str = "float32", lm_head: str = "default") -> str:
    """The format `--weights` means for this model: "q4_1" is "gguf" by its older name;
    "default" is "gguf" for a GGUF file run on the CPU in float32 where the kernels can run
    (the file's own codes), else "dense"."""
    if weights == "q4_1":
        return "gguf"
    if weights not in WEIGHTS:
        raise ValueError(f"unknown weights {weights!r}; choose one of {', '.join(WEIGHTS)}")
    if weights != "default":
        return weights
    if not path.is_file():
        return "dense"
    if dtype != "float32" or pick_device(device).type != "cpu" or lm_head != "default":
        load_log.info("%s: dequantized to %s (--dtype / --device / --lm-head ask for dense "
                      "weights)", path.name, dtype)
        return "dense"
    from model.quantized import QuantizedKernelUnavailable, quantized_kernels

    try:
        quantized_kernels()
    except QuantizedKernelUnavailable as exc:
        load_log.warning("%s: the file's own codes cannot run here (%s); dequantizing it "
                         "to fp32, which takes about 4 bytes a weight", path.name, exc)
        return "dense"
    return "gguf"


def weight_format(weights: str = "dense", *, activations: str = "float32",
                  device: str | None = None, dtype: str = "float32", fused_ops: bool = True,
                  matmul: str = "auto", lm_head: str = "default") -> WeightFormat:
    """The weight format of a resolved `--weights` (`resolve_weights`) with the options it
    takes. gguf and int8 run on the CPU in float32 (engine/config.py refuses --dtype /
    --device with them)."""
    if weights == "dense":
        if activations != "float32":
            raise ValueError("--activations int8 multiplies quantized codes; the model's "
                             "weights are dense here: drop --activations")
        return DenseWeights(pick_device(device), pick_dtype(dtype), fused_ops, matmul, lm_head)
    if lm_head != "default":
        raise ValueError(f"--lm-head {lm_head} applies to dense weights; --weights "
                         f"{weights} has its own LM head")
    if weights == "gguf":
        from model.quantized import Q4_1Weights

        return Q4_1Weights(activations=activations, fused_ops=fused_ops)
    if weights == "int8":
        from model.int8 import Int8Weights

        return Int8Weights(fused_ops=fused_ops)
    raise ValueError(f"unknown weights {weights!r}; choose one of {', '.join(WEIGHTS)}")


def load(source: str | None = None, *, weights: str = "default", activations: str = "float32",
         device: str | None = None, dtype: str = "float32", fused_ops: bool = True,
         matmul: str = "auto", lm_head: str = "default") -> LoadedModel:
    """The model `--model source` names, in `--weights`, fetched or prepared first if need
    be (None: the default model)."""
    from model.prepare import resolve_model_dir

    path = resolve_model_dir(source)
    resolved = resolve_weights(weights, path, device=device, dtype=dtype, lm_head=lm_head)
    fmt = weight_format(resolved, activations=activations, device=device, dtype=dtype,
                        fused_ops=fused_ops, matmul=matmul, lm_head=lm_head)
    load_log.info("loading %s on %s (%s, %s weights, %s activations)", path,
                  pick_device(device) if resolved == "dense" else "cpu", dtype, resolved,
                  activations)
    if resolved == "dense" and pick_device(device).type != "cpu":
        model = load_path(path, fmt)
    else:
        check_fits(path, resolved, dtype)
        model = load_path(path, fmt)
        give_back_freed_memory()
    return LoadedModel(model, path)


def load_model(model_dir: str | Path, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32, fused_ops: bool = True,
               matmul: str = "auto", lm_head: str = "default") -> nn.Module:
    """A folder's or GGUF file's model with its own weights, in `dtype` on `device`
    (`DenseWeights`)."""
    return load_path(Path(model_dir), DenseWeights(device, dtype, fused_ops, matmul, lm_head))


def log_torch_pieces(cfg: ModelConfig) -> None:
    """Say which parts of this architecture our CPU kernels leave to PyTorch."""
    if cfg.model_type == "gemma3_text":
        log.info("gemma3_text: its per-head q/k norms and gated tanh-GELU run in PyTorch "
                 "(and its (1 + weight) RMSNorms, except in float32); the matmuls, RoPE and "
                 "the paged decode attention (with its sliding window) use our kernels")
        return
    if cfg.qkv_bias:
        log.info("%s: q/k/v biases are added in PyTorch after the QKV matmul (the packed "
                 "GEMM has no bias epilogue)", cfg.model_type)
    if cfg.qk_norm:
        log.info("%s: the per-head q/k RMSNorm runs in PyTorch (the fused norm kernel takes "
                 "one weight for all rows)", cfg.model_type)
