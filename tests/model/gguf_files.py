"""Tiny GGUF files written as llama.cpp's converter writes them, for the GGUF loader's tests.

From a Hugging Face model's state dict: tensors renamed to GGUF's names, Llama's Q and K rows
permuted for llama.cpp's RoPE, Gemma's norms stored with their + 1, each matrix in a tensor
type of our choosing. Types gguf can quantize (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, F16, BF16) are
quantized from the weights; the K-quants, which gguf only dequantizes, get random codes under
a small fixed scale (any bytes are valid codes), so the model's weights are whatever they
decode to, the same for our loader and for transformers'.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3"}
LAYER_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
GEMMA_LAYER_NAMES = {**LAYER_NAMES, "pre_feedforward_layernorm": "ffn_norm",
                     "post_attention_layernorm": "post_attention_norm",
                     "post_feedforward_layernorm": "post_ffw_norm"}
# Where a K-quant block's fp16 scales sit, and the scale that keeps weights near +-0.3.
K_QUANT_SCALES = {"Q4_K": ((0, 2), 3e-4), "Q5_K": ((0, 2), 1.5e-4), "Q6_K": ((208,), 7e-5)}


def gguf_name(hf_name: str, model_type: str) -> str:
    stem, suffix = hf_name.rsplit(".", 1)
    if stem == "model.embed_tokens":
        return f"token_embd.{suffix}"
    if stem == "model.norm":
        return f"output_norm.{suffix}"
    if stem == "lm_head":
        return f"output.{suffix}"
    _, _, layer, rest = stem.split(".", 3)
    names = GEMMA_LAYER_NAMES if model_type == "gemma3_text" else LAYER_NAMES
    return f"blk.{layer}.{names[rest]}.{suffix}"


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's reordering of Q/K rows (rotate-half -> interleaved pairs)."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def encode(values: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

    qtype = GGMLQuantizationType[kind]
    if kind not in K_QUANT_SCALES:
        return quants.quantize(values, qtype)
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    rows, cols = values.shape
    codes = rng.integers(0, 256, (rows, cols // block, block_bytes), dtype=np.uint8)
    offsets, scale = K_QUANT_SCALES[kind]
    for offset in offsets:
        codes[..., offset:offset + 2] = np.frombuffer(np.float16(scale).tobytes(), np.uint8)
    return codes.reshape(rows, -1)


def write_tiny_gguf(path: Path, hf_model: torch.nn.Module, types: list[str],
                    sliding_window: int | None = None) -> dict[str, str]:
    """The model as a GGUF file; matrices take the types in turn (norms stay F32). Returns
    each GGUF tensor's type."""
    from gguf import GGMLQuantizationType, GGUFWriter

    cfg = hf_model.config
    model_type = cfg.model_type
    arch = ARCH[model_type]
    writer = GGUFWriter(str(path), arch)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    writer.add_uint32(f"{arch}.vocab_size", cfg.vocab_size)  # transformers reads it
    writer.add_uint32(f"{arch}.context_length", cfg.max_position_embeddings)
    writer.add_uint32(f"{arch}.embedding_length", cfg.hidden_size)
    writer.add_uint32(f"{arch}.block_count", cfg.num_hidden_layers)
    writer.add_uint32(f"{arch}.feed_forward_length", cfg.intermediate_size)
    writer.add_uint32(f"{arch}.attention.head_count", cfg.num_attention_heads)
    writer.add_uint32(f"{arch}.attention.head_count_kv", cfg.num_key_value_heads)
    writer.add_uint32(f"{arch}.attention.key_length", head_dim)
    writer.add_uint32(f"{arch}.attention.value_length", head_dim)
    writer.add_uint32(f"{arch}.rope.dimension_count", head_dim)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    theta = cfg.rope_parameters.get("rope_theta") or cfg.rope_parameters[
        "full_attention"]["rope_theta"]
    writer.add_float32(f"{arch}.rope.freq_base", theta)
    writer.add_uint32("tokenizer.ggml.eos_token_id", 0)
    if sliding_window is not None:
        writer.add_uint32(f"{arch}.attention.sliding_window", sliding_window)
    rng = np.random.default_rng(0)
    written, turn = {}, 0
    state = hf_model.state_dict()
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    for hf_name, tensor in state.items():
        name = gguf_name(hf_name, model_type)
        values = tensor.detach().float().numpy()
        if model_type == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = cfg.num_attention_heads if "attn_q" in name else cfg.num_key_value_heads
            values = llama_cpp_permute(values, heads)
        if model_type == "gemma3_text" and name.endswith("norm.weight"):
            values = values + 1.0
        kind = "F32"
        if name == "token_embd.weight":
            kind = "Q8_0"  # as the released files keep it
        elif values.ndim == 2:
            kind = types[turn % len(types)]
            turn += 1
        data = values if kind == "F32" else encode(values, kind, rng)
        writer.add_tensor(name, data, raw_dtype=GGMLQuantizationType[kind])
        written[name] = kind
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return written


def write_sparse_gguf(path: Path, arch: str, fields: dict[str, int | float],
                      tensors: list[tuple[str, tuple[int, int] | tuple[int], str]],
                      tokenizer_from: Path | None = None) -> int:
    """A GGUF file with real metadata and tensor headers whose data is all zeros and costs
    no disk: the header is written, then the file is extended to its full size (a sparse
    file). `tensors`: (GGUF name, shape [rows, cols] or [n], type); `tokenizer_from`: a GGUF
    file whose tokenizer fields are copied. Returns the file's size."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter

    writer = GGUFWriter(str(path), arch)
    for key, value in fields.items():
        add = writer.add_uint32 if isinstance(value, int) else writer.add_float32
        add(f"{arch}.{key}", value)
    if tokenizer_from is None:
        writer.add_uint32("tokenizer.ggml.eos_token_id", 0)
    else:
        for key, field in GGUFReader(str(tokenizer_from)).fields.items():
            if key.startswith("tokenizer."):
                writer.add_key_value(key, field.contents(), field.types[0],
                                     field.types[1] if len(field.types) > 1 else None)
    data_bytes = 0
    for name, shape, kind in tensors:
        qtype = GGMLQuantizationType[kind]
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        byte_shape = (*shape[:-1], shape[-1] // block * block_bytes)
        nbytes = int(np.prod(byte_shape))
        dtype = np.float32 if kind == "F32" else np.uint8
        writer.add_tensor_info(name, byte_shape if kind != "F32" else shape, np.dtype(dtype),
                               nbytes, raw_dtype=qtype)
        data_bytes += -(-nbytes // 32) * 32
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    start = -(-path.stat().st_size // 32) * 32
    with path.open("r+b") as f:
        f.truncate(start + data_bytes)
    return start + data_bytes


def qwen2_7b_tensors() -> tuple[dict[str, int | float], list]:
    """Qwen2.5-7B's shapes (28 layers, hidden 3584, 28 heads on 4 K/V heads, FFN 18944, a
    152,064-token vocabulary) typed as a Q4_K_M file types them."""
    hidden, ffn, layers, vocab, head_dim, kv = 3584, 18944, 28, 152064, 128, 4
    fields = {"context_length": 32768, "embedding_length": hidden, "block_count": layers,
              "feed_forward_length": ffn, "attention.head_count": 28,
              "attention.head_count_kv": kv, "attention.layer_norm_rms_epsilon": 1e-6,
              "rope.freq_base": 1e6}
    tensors: list = [("token_embd.weight", (vocab, hidden), "Q4_K"),
                     ("output_norm.weight", (hidden,), "F32"),
                     ("output.weight", (vocab, hidden), "Q6_K")]
    for i in range(layers):
        six = "Q6_K" if i % 2 == 0 else "Q4_K"  # half the layers' v and down, as Q4_K_M
        tensors += [(f"blk.{i}.attn_norm.weight", (hidden,), "F32"),
                    (f"blk.{i}.ffn_norm.weight", (hidden,), "F32"),
                    (f"blk.{i}.attn_q.weight", (hidden, hidden), "Q4_K"),
                    (f"blk.{i}.attn_q.bias", (hidden,), "F32"),
                    (f"blk.{i}.attn_k.weight", (kv * head_dim, hidden), "Q4_K"),
                    (f"blk.{i}.attn_k.bias", (kv * head_dim,), "F32"),
                    (f"blk.{i}.attn_v.weight", (kv * head_dim, hidden), six),
                    (f"blk.{i}.attn_v.bias", (kv * head_dim,), "F32"),
                    (f"blk.{i}.attn_output.weight", (hidden, hidden), "Q4_K"),
                    (f"blk.{i}.ffn_gate.weight", (ffn, hidden), "Q4_K"),
                    (f"blk.{i}.ffn_up.weight", (ffn, hidden), "Q4_K"),
                    (f"blk.{i}.ffn_down.weight", (hidden, ffn), six)]
    return fields, tensors
