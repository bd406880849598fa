"""Linear layers and an embedding on a GGUF file's own codes, and the kernels behind them.

Each weight's codes are kept in one of the block forms of model/weights/blocks.py, packed once
for the kernels (model/kernels/csrc/quantized_kernel.h): output rows in groups of 16, one fp32 lane
each. A kernel dequantizes each weight exactly as gguf's reference code does and multiplies
by FMA, so a layer computes the fp32 model on the dequantized weights, summed in another
order. `QuantizedLinear` is one matrix, `PartsLinear` a fused module whose parts differ in
type (each on its kernel), `QuantizedEmbedding` the token embedding looked up in its codes.

`--activations int8` (opt-in, not exact) multiplies Q4_1 and Q8_0 codes by activations
rounded to int8 per block of 32, with integer dot products (AVX512-VNNI,
model/kernels/csrc/q4_1_int8act_cpu.cpp, or AVX2's pair products, q4_1_int8act_avx2.cpp, with the
same results); its error against the exact path is measured in
tests/model/test_q4_1_int8act.py. The weight format that builds these layers from a
checkpoint is model/weights/gguf_format.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import Tensor, nn

from model.kernels.build import cpu_kernels_error, load_cpu_kernels
from model.kernels.cpu import (
    cpu_has_vnni,
    cpu_supports,
    cpu_supports_avx2_quantized,
    cpu_supports_quantized,
)
from model.weights.blocks import BlockTensor

log = logging.getLogger("nano_vllm.kernel")
GROUP = 16  # output rows per group in the kernel's layout: one fp32 lane each


class QuantizedKernelUnavailable(RuntimeError):
    """The quantized kernel cannot run here; the message says what is missing."""


def quantized_kernels() -> dict[str, Callable[[Tensor, Tensor, int], Tensor]]:
    """{form: fn} for every kernel form (model/weights/blocks.py FORM_BYTES), each
    fn(x [M, K] fp32, packed, out_features) -> [M, N].

    Raises QuantizedKernelUnavailable naming what is missing (there is no slow fallback: a
    dequantized fp32 model is what the default --weights already runs)."""
    if not cpu_supports_quantized():
        raise QuantizedKernelUnavailable(
            f"the quantized weights (--weights q4_1, int8) need a CPU with AVX-512 (F, BW, VL, "
            f"DQ) or AVX2 with FMA and F16C; this one offers "
            f"{torch.backends.cpu.get_cpu_capability()}. Use the default fp32 weights instead.")
    module = load_cpu_kernels()
    if module is None:  # no compiler, no ninja, a failed build: say which
        raise QuantizedKernelUnavailable(
            f"the CPU kernels could not be built ({cpu_kernels_error()}). They need a C++ "
            "compiler with OpenMP and ninja; use the default fp32 weights instead.")
    return {"Q4_1": module.q4_1_linear, "Q8_0": module.q8_0_linear,
            "Q5_0": module.q5_0_linear, "Q4_K": module.q4_k_linear,
            "Q5_K": module.q5_k_linear, "Q6_K": module.q6_k_linear,
            "F16": module.f16_linear, "BF16": module.bf16_linear}


ACTIVATIONS = ("float32", "int8")  # exact, or the VNNI speed mode
INT8_ACTIVATION_KINDS = ("Q4_1", "Q8_0")  # the block types with an int8-activation kernel


def int8_activation_kernels() -> dict[str, Callable[[Tensor, Tensor, int], Tensor]]:
    """{"Q4_1": fn, "Q8_0": fn} of `--activations int8`, each fn(x [M, K] fp32, packed,
    out_features), or QuantizedKernelUnavailable naming what is missing (AVX512-VNNI or
    AVX2, or the build)."""
    quantized_kernels()  # the CPU and the build first: their own errors
    if not ((cpu_supports() and cpu_has_vnni()) or cpu_supports_avx2_quantized()):
        raise QuantizedKernelUnavailable(
            "--activations int8 needs a CPU with AVX-512 and AVX512-VNNI (avx512_vnni in "
            "/proc/cpuinfo), or AVX2 with FMA and F16C, for its int8 dot products; this one "
            "has neither. Drop --activations to run the exact q4_1 path.")
    module = load_cpu_kernels()
    return {"Q4_1": module.q4_1_int8act_linear, "Q8_0": module.q8_0_int8act_linear}


def pack_for_kernel(weight: BlockTensor, code_width: int = 1) -> Tensor:
    """GGUF blocks [rows, blocks, bytes] -> the kernel's [groups, blocks, bytes] layout.

    Rows are padded with zero blocks (w = 0) to a multiple of 16, then each group's 16 rows
    are interleaved per block: scales side by side, then the codes with the row fastest in
    runs of code_width bytes (4 for the int8-activation kernels: one int32 lane's inputs).
    For those kernels Q8_0's codes are stored offset to unsigned (q + 128, `vpdpbusd`'s
    unsigned operand). Packed a slice of groups at a time: the temporaries stay small."""
    rows, blocks, block_bytes = weight.blocks.shape
    groups = -(-rows // GROUP)
    out = torch.empty(groups, blocks, GROUP * block_bytes, dtype=torch.uint8)
    spans = field_spans(weight.kind, block_bytes, code_width)
    step = PACK_GROUPS
    for g0 in range(0, groups, step):
        g1 = min(groups, g0 + step)
        raw = torch.zeros((g1 - g0) * GROUP, blocks, block_bytes, dtype=torch.uint8)
        part = weight.blocks[g0 * GROUP:g1 * GROUP]
        raw[:len(part)] = part
        if weight.kind == "Q8_0" and code_width > 1:  # the int8-activation kernel: q + 128
            raw[..., 2:34] ^= 0x80
        fields = [interleave(raw[..., start:end], width) for start, end, width in spans]
        out[g0:g1] = torch.cat(fields, dim=-1)
    return out


PACK_GROUPS = 256  # groups of 16 rows packed at a time


def interleave(field: Tensor, width: int) -> Tensor:
    """[groups x 16 rows, blocks, n * width] -> [groups, blocks, n * 16 * width], the row
    inside each run of `width` bytes."""
    rows, blocks = field.shape[:2]
    field = field.reshape(rows // GROUP, GROUP, blocks, -1, width)
    return field.permute(0, 2, 3, 1, 4).reshape(rows // GROUP, blocks, -1)


# Each form's fields: (start byte, width of one lane's run); codes last.
FIELDS = {"Q4_1": [(0, 2), (2, 2), (4, 1)],  # d, m, 16 code bytes (j, j + 16)
          "Q8_0": [(0, 2), (2, 1)],  # d, 32 int8 codes
          "Q5_0": [(0, 2), (2, 4), (6, 1)],  # d, 32 fifth bits, 16 code bytes
          "Q5_K": [(0, 4), (4, 4), (8, 4), (12, 1)],  # fp32 s and m, fifth bits, codes
          "F16": [(0, 2)], "BF16": [(0, 2)],  # 32 values
          # Units of 256: d, dmin, 8 sub-scales, 8 sub-mins, 8 x 16 code bytes.
          "Q4_K": [(0, 2), (2, 2), (4, 1), (12, 1), (20, 1)],
          # Units of 256: d, 16 sub-scales, 8 x 16 low-nibble bytes, 8 x 8 high-bit bytes.
          "Q6_K": [(0, 2), (2, 1), (18, 1), (146, 1)]}


def field_spans(kind: str, block_bytes: int, code_width: int = 1) -> list[tuple[int, int, int]]:
    """(start, end, lane run width) of each field of a block of `kind`; the codes' run is
    `code_width` where the form has 1-byte codes (Q4_1, Q8_0: the int8-activation kernels)."""
    fields = FIELDS[kind]
    if kind in ("Q4_1", "Q8_0"):
        fields = [*fields[:-1], (fields[-1][0], code_width)]
    ends = [start for start, _ in fields[1:]] + [block_bytes]
    return [(start, end, width) for (start, width), end in zip(fields, ends, strict=True)]


def unpack_rows(packed: Tensor, kind: str, ids: Tensor, code_width: int = 1) -> BlockTensor:
    """Rows `ids` of a packed matrix as the blocks `pack_for_kernel` took: its inverse, for
    the rows an embedding lookup needs."""
    rows = packed[ids // GROUP]  # [n, blocks, 16 x block bytes]: each id's group
    n, blocks = rows.shape[:2]
    block_bytes = packed.shape[2] // GROUP
    lane, take = ids % GROUP, torch.arange(n)
    fields = []
    for start, end, width in field_spans(kind, block_bytes, code_width):
        span = rows[..., GROUP * start:GROUP * end].reshape(n, blocks, -1, GROUP, width)
        fields.append(span[take, :, :, lane].reshape(n, blocks, -1))
    raw = torch.cat(fields, dim=-1)
    if kind == "Q8_0" and code_width > 1:
        raw[..., 2:34] ^= 0x80
    return BlockTensor(kind, raw)


class QuantizedLinear(nn.Module):
    """y = x @ Wᵀ for x [..., in] fp32, W kept as GGUF codes: Q4_1, Q8_0, Q5_0 or
    the other forms of model/weights/blocks.py ([out, in] blocks of 32).

    The same contract as model/llama.py's Linear; the result is the fp32 matmul on the
    dequantized weights up to summation order, or with activations="int8" the matmul on x
    rounded to int8 per block of 32."""

    def __init__(self, weight: BlockTensor, activations: str = "float32") -> None:
        super().__init__()
        if activations not in ACTIVATIONS or (activations == "int8"
                                               and weight.kind not in INT8_ACTIVATION_KINDS):
            raise ValueError(f"{weight.kind} weights take activations float32"
                             f"{' or int8' if weight.kind in INT8_ACTIVATION_KINDS else ''}, "
                             f"not {activations}")
        self.kind, self.activations = weight.kind, activations
        self.in_features, self.out_features = weight.cols, weight.rows
        self.code_width = 4 if activations == "int8" else 1
        if activations == "int8":
            self.kernel = int8_activation_kernels()[weight.kind]
            self.register_buffer("packed", pack_for_kernel(weight, self.code_width))
        else:
            self.kernel = quantized_kernels()[weight.kind]
            self.register_buffer("packed", pack_for_kernel(weight))

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() == 2:  # the engine's flat batch: skip the reshapes (121 calls a step)
            return self.kernel(x.contiguous(), self.packed, self.out_features)
        flat = x.reshape(-1, self.in_features).contiguous()
        return self.kernel(flat, self.packed, self.out_features).reshape(
            *x.shape[:-1], self.out_features)

    @property
    def matmul_path(self) -> str:
        return f"{self.kind}-{'int8act-' if self.activations == 'int8' else ''}kernel"

    def extra_repr(self) -> str:
        return (f"{self.kind}, in={self.in_features}, out={self.out_features}, "
                f"activations={self.activations}")


class PartsLinear(nn.Module):
    """A fused layer (q/k/v, gate/up) whose parts are of different types: each part on its
    own kernel, the outputs side by side. The same contract as QuantizedLinear."""

    def __init__(self, parts: list[QuantizedLinear]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([part(x) for part in self.parts], dim=-1)


class QuantizedEmbedding(nn.Module):
    """Token embedding looked up in its codes: rows are unpacked and dequantized on lookup
    (exact: the same values the matmul uses), so the embedding costs no fp32 copy.

    From a quantized LM head (tied weights: the head's packed codes serve both) or from the
    file's blocks of an untied embedding, kept as they are."""

    def __init__(self, head: QuantizedLinear | None = None,
                 blocks: BlockTensor | None = None) -> None:
        super().__init__()
        if (head is None) == (blocks is None):
            raise ValueError("an embedding reads either a head's packed codes or blocks")
        if head is not None:
            self.kind, self.code_width = head.kind, head.code_width
            self.num_embeddings, self.embedding_dim = head.out_features, head.in_features
            self.register_buffer("packed", head.packed)  # the same tensor, not a copy
        else:
            self.kind, self.code_width, self.packed = blocks.kind, 1, None
            self.num_embeddings, self.embedding_dim = blocks.rows, blocks.cols
            self.register_buffer("blocks", blocks.blocks)
        # Callers read the model's dtype and device from embed_tokens.weight; an empty fp32
        # stand-in answers them (and fails loudly if anyone tries to index it).
        self.register_buffer("weight", torch.empty(0, self.embedding_dim), persistent=False)

    def forward(self, input_ids: Tensor) -> Tensor:
        ids = input_ids.reshape(-1)
        if self.packed is not None:
            rows = unpack_rows(self.packed, self.kind, ids, self.code_width)
        else:
            rows = BlockTensor(self.kind, self.blocks[ids])
        return rows.dequantize().reshape(*input_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.kind}, {self.num_embeddings} x {self.embedding_dim}"


def check_activations(activations: str) -> None:
    """Fail (before touching a model) if the layers cannot run with these activations here."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be one of {ACTIVATIONS}, not {activations!r}")
    if activations == "int8":
        int8_activation_kernels()
    else:
        quantized_kernels()
