"""Load a Hugging Face Llama-format folder into our LlamaModel."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from model.config import ModelConfig
from model.llama import LlamaModel

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


def transposed(*weights: torch.Tensor) -> torch.Tensor:
    """nn.Linear weights [out, in], fused along out, as our Linear's [in, out]."""
    return torch.cat(weights).t().contiguous()


def to_our_names(hf: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Rename Hugging Face tensors to ours, fusing q/k/v and gate/up along the output axis."""
    ours = {
        "embed_tokens.weight": hf["model.embed_tokens.weight"],
        "norm.weight": hf["model.norm.weight"],
    }
    # A tied head is the embedding (Hugging Face folders omit or duplicate lm_head.weight).
    ours["lm_head.weight_t"] = transposed(ours["embed_tokens.weight"] if cfg.tie_word_embeddings
                                          else hf["lm_head.weight"])
    for i in range(cfg.num_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        attn, mlp = src + "self_attn.", src + "mlp."
        ours[dst + "self_attn.qkv_proj.weight_t"] = transposed(
            hf[attn + "q_proj.weight"], hf[attn + "k_proj.weight"], hf[attn + "v_proj.weight"])
        ours[dst + "self_attn.o_proj.weight_t"] = transposed(hf[attn + "o_proj.weight"])
        ours[dst + "mlp.gate_up_proj.weight_t"] = transposed(
            hf[mlp + "gate_proj.weight"], hf[mlp + "up_proj.weight"])
        ours[dst + "mlp.down_proj.weight_t"] = transposed(hf[mlp + "down_proj.weight"])
        ours[dst + "input_layernorm.weight"] = hf[src + "input_layernorm.weight"]
        ours[dst + "post_attention_layernorm.weight"] = hf[src + "post_attention_layernorm.weight"]
    return ours


def load_model(model_dir: str | Path, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32) -> LlamaModel:
    model_dir = Path(model_dir)
    cfg = ModelConfig.from_dir(model_dir)
    with torch.device("meta"):  # no time spent initialising weights we overwrite anyway
        model = LlamaModel(cfg)
    state = to_our_names(read_hf_weights(model_dir), cfg)
    model.load_state_dict(state, assign=True, strict=True)
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    model.reset_rotary()
    return model
