"""Load a Hugging Face Llama-format folder into our LlamaModel."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from model.config import ModelConfig
from model.cpu_kernel import load_fused_ops
from model.layers import use_fused_ops
from model.registry import architecture

FUSED_DTYPES = (torch.float32, torch.bfloat16)
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


def load_model(model_dir: str | Path, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32, fused_ops: bool = True) -> nn.Module:
    """The model in `dtype` on `device`; on a CPU with fused_ops, the small ops between the
    matmuls run as compiled kernels where they can be built (model/layers.py)."""
    model_dir = Path(model_dir)
    cfg = ModelConfig.from_dir(model_dir)
    arch = architecture(cfg.model_type)
    with torch.device("meta"):  # no time spent initialising weights we overwrite anyway
        model = arch.model_class(cfg)
    state = arch.convert_hf_weights(read_hf_weights(model_dir), cfg)
    model.load_state_dict(state, assign=True, strict=True)
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    if fused_ops and torch.device(device).type == "cpu" and dtype in FUSED_DTYPES:
        use_fused_ops(model, load_fused_ops())
    return model
