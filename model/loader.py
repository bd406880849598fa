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

The formats (model/weights/): "dense" (dense.py: the checkpoint's weights in --dtype), "gguf"
(gguf_format.py, the file's own codes; "q4_1" is its older name) and "int8" (int8.py).
`load_model`, `load_q4_1_model` and `load_int8_model` are this path for a given folder or
file, for tests and benchmarks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from model.checkpoint import WeightFormat, build_model
from model.memory import check_fits, give_back_freed_memory
from model.registry import architecture
from model.weights.dense import DenseWeights

log = logging.getLogger("nano_vllm.kernel")
load_log = logging.getLogger("nano_vllm.engine")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WEIGHTS = ("default", "gguf", "dense", "q4_1", "int8")  # q4_1: gguf's older name


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


def load_path(path: Path, fmt: WeightFormat) -> nn.Module:
    """A folder's or file's model in the weight format `fmt` (steps 2-4 of the module
    docstring)."""
    checkpoint = fmt.read(path)
    arch = architecture(checkpoint.config.model_type)
    fmt.check(checkpoint.config)
    model = fmt.finish(build_model(checkpoint, arch, fmt))
    if not checkpoint.config.bidirectional:
        return model
    from model.embedding import is_sentence_transformers, wrap_encoder

    if not is_sentence_transformers(path):
        raise ValueError(f"{path}: a bidirectional encoder is served as an embedding model, "
                         "from a sentence-transformers folder (modules.json names its pooling)")
    return wrap_encoder(model, path)


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
    from model.weights.quantized import QuantizedKernelUnavailable, quantized_kernels

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
        from model.weights.gguf_format import GGUFWeights

        return GGUFWeights(activations=activations, fused_ops=fused_ops)
    if weights == "int8":
        from model.weights.int8 import Int8Weights

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


def load_q4_1_model(model_dir: str | Path, gguf_path: str | Path | None = None,
                    activations: str = "float32") -> nn.Module:
    """`--weights q4_1`: the model of model_dir (its config.json) built straight from the GGUF,
    never holding fp32 weights (~100 MB resident instead of ~650 MB at load).

    gguf_path defaults to the default model's GGUF (downloaded once, then cached);
    activations="int8" is `--activations int8` (the layers' matmuls, not exact)."""
    from model.weights.gguf_format import GGUFWeights

    return load_path(Path(model_dir), GGUFWeights(activations, gguf_path=gguf_path))


def load_int8_model(model_dir: str | Path) -> nn.Module:
    """`--weights int8`: a folder's model, each layer quantized to int8 as it is built."""
    from model.weights.int8 import Int8Weights

    return load_path(Path(model_dir), Int8Weights())
