"""Load a Hugging Face folder or a GGUF file (an architecture of model/registry.py) into our
model. A GGUF file is dequantized to fp32 at load (model/gguf_checkpoint.py) and from then
on goes the folder's way."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from model.config import ModelConfig
from model.cpu_kernel import load_fused_ops
from model.dense_linear import pack_model_linears
from model.layers import use_fused_ops
from model.registry import architecture

log = logging.getLogger("nano_vllm.kernel")

CPU_KERNEL_DTYPES = (torch.float32, torch.bfloat16)
MATMULS = ("auto", "torch")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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


def read_hf_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir}")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                weights[name] = f.get_tensor(name)
    return weights


def read_checkpoint(model_path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """The config and Hugging Face-named weights of a folder, or of a GGUF file."""
    if model_path.is_file():
        from model.gguf_checkpoint import read_gguf_checkpoint

        checkpoint = read_gguf_checkpoint(model_path)
        return checkpoint.config, checkpoint.hf_weights
    return ModelConfig.from_dir(model_path), read_hf_weights(model_path)


def load_model(model_dir: str | Path, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32, fused_ops: bool = True,
               matmul: str = "auto") -> nn.Module:
    """The model in `dtype` on `device`. On a CPU, where our kernels can be built and run:
    with fused_ops, the small ops between the matmuls run compiled (model/layers.py); with
    matmul "auto", the linear layers' weights are packed once for our own GEMM kernel
    (model/dense_linear.py); "torch" keeps PyTorch's matmuls."""
    if matmul not in MATMULS:
        raise ValueError(f"unknown matmul {matmul!r}; choose one of {', '.join(MATMULS)}")
    cfg, hf_weights = read_checkpoint(Path(model_dir))
    arch = architecture(cfg.model_type)
    with torch.device("meta"):  # no time spent initialising weights we overwrite anyway
        model = arch.model_class(cfg)
    state = arch.convert_hf_weights(hf_weights, cfg)
    del hf_weights
    model.load_state_dict(state, assign=True, strict=True)
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    on_cpu = torch.device(device).type == "cpu" and dtype in CPU_KERNEL_DTYPES
    if fused_ops and on_cpu:
        use_fused_ops(model, load_fused_ops())
    if matmul == "auto" and on_cpu:
        pack_model_linears(model)
    if (fused_ops or matmul == "auto") and on_cpu:
        log_torch_pieces(cfg)
    return model


def log_torch_pieces(cfg: ModelConfig) -> None:
    """Say which parts of this architecture our CPU kernels leave to PyTorch."""
    if cfg.model_type == "gemma3_text":
        log.info("gemma3_text: its (1 + weight) RMSNorms, RoPE and gated tanh-GELU run in "
                 "PyTorch (the fused kernels implement Llama's forms); the matmuls and the "
                 "paged decode attention (with its sliding window) use our kernels")
        return
    if cfg.qkv_bias:
        log.info("%s: q/k/v biases are added in PyTorch after the QKV matmul (the packed "
                 "GEMM has no bias epilogue)", cfg.model_type)
    if cfg.qk_norm:
        log.info("%s: the per-head q/k RMSNorm runs in PyTorch (the fused norm kernel takes "
                 "one weight for all rows)", cfg.model_type)
