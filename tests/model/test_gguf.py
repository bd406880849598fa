"""GGUF files of every architecture against transformers' own GGUF loader, and what a bad
file is told.

Tiny random models (tests/model/test_architectures.py's, at widths of 256 so that every
tensor type fits its blocks) are written as llama.cpp writes GGUF (tests/model/gguf_files.py):
Llama's Q/K permuted, Gemma's norms with their + 1, the matrices spread over every supported
type. transformers dequantizes the same file with the same gguf code, so both models hold the
same weights: the logits must agree to LOGITS_ATOL, on a prompt longer than Gemma's window.
"""

from __future__ import annotations

import re

import pytest
import torch

from model.dense_linear import PackedLinear
from model.gguf.checkpoint import TENSOR_TYPES, GGUFError, read_gguf_checkpoint
from model.gguf.header import read_tensor_extents
from model.layers import Linear, causal_attention
from model.loader import load_model
from tests.conftest import LOGITS_ATOL
from tests.model.gguf_files import write_tiny_gguf

torch.set_grad_enabled(False)

WIDE = dict(vocab_size=4096, hidden_size=256, intermediate_size=512, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6)
MATRIX_TYPES = [t for t in TENSOR_TYPES if t != "F32"]
WINDOW = 12


def hf_config(name: str):
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen2Config, Qwen3Config

    if name == "llama":
        return LlamaConfig(**WIDE, num_hidden_layers=2, tie_word_embeddings=True)
    if name == "qwen2":
        return Qwen2Config(**WIDE, num_hidden_layers=2, rope_theta=1e6, tie_word_embeddings=False)
    if name == "qwen3":  # head_dim 128, not 256 / 4: read from attention.key_length
        return Qwen3Config(**WIDE, num_hidden_layers=2, head_dim=128, rope_theta=1e6,
                           tie_word_embeddings=True)
    # Six layers: llama.cpp's fixed pattern makes the sixth the one full-attention layer.
    return Gemma3TextConfig(**{**WIDE, "num_key_value_heads": 1}, num_hidden_layers=6,
                            head_dim=256, sliding_window=WINDOW, tie_word_embeddings=True)


def write_and_load(arch: str, matrix_types: list[str], tmp_path_factory):
    """(GGUF path, the types written, transformers' model loaded from that file)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    source = AutoModelForCausalLM.from_config(hf_config(arch), dtype=torch.float32)
    for name, param in source.named_parameters():
        gemma = arch == "gemma3"
        if name.endswith("norm.weight"):  # gains near 1 ((1 + w) for Gemma)
            param.copy_((0.0 if gemma else 1.0) + 0.3 * torch.randn_like(param))
        else:
            param.normal_(0, 0.15)  # 0.3 at width 64 in test_architectures: same scale
    folder = tmp_path_factory.mktemp(f"gguf-{arch}")
    path = folder / "tiny.gguf"
    types = write_tiny_gguf(path, source, matrix_types, WINDOW if arch == "gemma3" else None)
    del source
    theirs = AutoModelForCausalLM.from_pretrained(folder, gguf_file=path.name,
                                                  dtype=torch.float32).eval()
    return path, types, theirs


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "gemma3"])
def tiny_gguf(request, tmp_path_factory):
    return write_and_load(request.param, MATRIX_TYPES, tmp_path_factory)


def test_gguf_logits_match_transformers_loading_the_same_file(tiny_gguf):
    path, types, theirs = tiny_gguf
    ours = load_model(path)
    assert ours.cfg.vocab_size == theirs.config.vocab_size
    c = theirs.config
    assert ours.cfg.head_dim == (getattr(c, "head_dim", None)
                                 or c.hidden_size // c.num_attention_heads)
    ids = torch.randint(0, WIDE["vocab_size"], (1, 40), generator=torch.Generator().manual_seed(1))
    expected = theirs(ids).logits[0]
    mine = ours(ids, torch.arange(40)[None], causal_attention)[0]
    diff = (mine - expected).abs().max().item()
    used = sorted(set(types.values()))
    print(f"{ours.cfg.model_type} from GGUF ({', '.join(used)}): max |diff| vs transformers = "
          f"{diff:.2e}; logits std {expected.std():.2f}")
    assert set(MATRIX_TYPES) <= set(types.values()), "every supported type, in every file"
    assert expected.std() > 1.0
    assert diff < LOGITS_ATOL
    if ours.cfg.model_type == "gemma3_text":
        assert ours.cfg.sliding_layers == (True,) * 5 + (False,)
        assert ours.cfg.sliding_window == WINDOW


@pytest.fixture(scope="module")
def llama_gguf(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    source = AutoModelForCausalLM.from_config(hf_config("llama"), dtype=torch.float32)
    path = tmp_path_factory.mktemp("bad") / "tiny.gguf"
    write_tiny_gguf(path, source, ["Q8_0"])
    return path


def test_a_truncated_file_is_refused_before_any_tensor_is_read(llama_gguf, tmp_path):
    cut = tmp_path / "cut.gguf"
    data = llama_gguf.read_bytes()
    cut.write_bytes(data[:len(data) - 1000])
    with pytest.raises(GGUFError, match=r"tensor \S+ .* truncated or corrupt") as err:
        read_gguf_checkpoint(cut)
    print(err.value)
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(data[:200])
    with pytest.raises(GGUFError, match="truncated or corrupt") as err:
        read_gguf_checkpoint(header_only)
    print(err.value)
    assert str(header_only) in str(err.value)


def test_unsupported_architecture_and_tensor_type_are_named(llama_gguf, tmp_path):
    data = llama_gguf.read_bytes()
    other = tmp_path / "other.gguf"
    # general.architecture is the first string value: "llama" -> "llamb" (same length)
    other.write_bytes(data.replace(b"llama", b"llamb", 1))
    with pytest.raises(GGUFError, match=re.escape("GGUF architecture 'llamb' is not supported")):
        read_gguf_checkpoint(other)
    # Retype the first tensor as IQ2_XXS in its header entry: after its name come the
    # number of dimensions (uint32), the dimensions (uint64 each), then the type (uint32).
    first = read_tensor_extents(llama_gguf)[0][0]
    raw = bytearray(data)
    at = raw.index(first.name.encode()) + len(first.name)
    type_at = at + 4 + 8 * len(first.dims)
    raw[type_at:type_at + 4] = (16).to_bytes(4, "little")  # GGML_TYPE_IQ2_XXS
    other.write_bytes(bytes(raw))
    with pytest.raises(GGUFError, match=f"tensor {re.escape(first.name)} is IQ2_XXS") as err:
        read_gguf_checkpoint(other)
    print(err.value)


# Two layers' matrices in state-dict order (q, k, v, o, gate, up, down), as Q4_K_M mixes
# them: fused parts of one type (Q5_0 q/k, gate/up), of types that share no form (Q5_0 +
# Q8_0, Q4_K + Q6_K: a kernel each), and the 16-bit types.
CODE_TYPES = ["Q5_0", "Q5_0", "Q8_0", "Q4_K", "Q4_1", "Q4_1", "Q6_K",
              "Q5_0", "Q5_0", "Q5_0", "Q6_K", "Q4_K", "Q6_K", "BF16", "F16"]


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma3"])
def codes_gguf(request, tmp_path_factory):
    return write_and_load(request.param, CODE_TYPES, tmp_path_factory)


def check_on_codes(path, theirs, expected_forms: set[str]):
    """By default a GGUF file runs every matrix on its own codes (no fp32 copy of any) and
    gives transformers' logits within the same tolerance, since the weights are the same."""
    from model.loader import load
    from model.weights.quantized import (
        PartsLinear,
        QuantizedEmbedding,
        QuantizedLinear,
        quantized_kernels,
    )

    try:
        quantized_kernels()
    except Exception as exc:  # no AVX2 or no compiler: the default is then dense
        pytest.skip(str(exc))
    ours = load(str(path)).model
    linears = [m for m in ours.modules() if isinstance(m, Linear | PackedLinear)]
    forms = {m.kind for m in ours.modules() if isinstance(m, QuantizedLinear)}
    ids = torch.randint(0, WIDE["vocab_size"], (1, 40), generator=torch.Generator().manual_seed(1))
    expected = theirs(ids).logits[0]
    mine = ours(ids, torch.arange(40)[None], causal_attention)[0]
    diff = (mine - expected).abs().max().item()
    parts = sum(isinstance(m, PartsLinear) for m in ours.modules())
    print(f"{ours.cfg.model_type} on its codes: forms {sorted(forms)}, {parts} layers of "
          f"parts; max |diff| vs transformers = {diff:.2e}")
    assert not linears, "a matrix on fp32 weights"
    assert expected_forms <= forms
    assert isinstance(ours.embed_tokens, QuantizedEmbedding)
    assert expected.std() > 1.0
    assert diff < LOGITS_ATOL
    return ours


def test_a_gguf_file_runs_on_its_own_codes_by_default(codes_gguf):
    path, _, theirs = codes_gguf
    ours = check_on_codes(path, theirs, {"Q5_0", "Q8_0", "Q4_K", "Q4_1", "Q6_K", "BF16"})
    if ours.cfg.model_type in ("llama", "qwen2"):  # the decode stack takes every form
        from model.decode_stack import unsupported

        assert unsupported(ours) is None


def test_every_tensor_type_runs_on_its_own_codes(tiny_gguf):
    """Q4_0 runs in Q4_K's form, Q5_1 and Q5_K in Q5_K's."""
    path, _, theirs = tiny_gguf
    check_on_codes(path, theirs, {"Q8_0", "Q4_K", "Q4_1", "Q5_0", "Q5_K", "Q6_K", "F16",
                                  "BF16"})
