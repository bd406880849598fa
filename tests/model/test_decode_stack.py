"""The decode stack (every layer of a decode step in one C++ call) against the model's own
forward: the same kernels in the same order, so the same logits, bit for bit.

The tests against Hugging Face (test_paged_attention.py, test_architectures.py) run through
the runner, which uses the stack on decode steps wherever it applies; here the two paths are
set side by side on the same steps, and the cases it must refuse are checked.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from engine.model_runner import ModelRunner
from engine.step_types import SequenceStep
from kvcache.block_allocator import BlockAllocator
from kvcache.kv_cache_manager import KVCacheManager
from kvcache.pool import KVCachePool
from model.decode_stack import DecodeStack, unsupported
from model.layers import Linear, use_fused_ops
from tests.model.test_paged_attention import prefill_prompts

torch.set_grad_enabled(False)


def runner_pair(model) -> tuple[ModelRunner, ModelRunner, KVCacheManager]:
    """Two runners over one pool, with and without the stack, and the pool's manager."""
    cfg = model.cfg
    pool = KVCachePool(cfg.num_layers, 64, cfg.num_kv_heads, cfg.head_dim,
                       model.norm.weight.dtype)
    fast = ModelRunner(model, pool, "cpu-kernel")
    if fast.attention_backend != "cpu-kernel" or fast.decode_stack is None:
        pytest.skip("the CPU kernels do not run here")
    slow = ModelRunner(model, pool, "cpu-kernel", decode_stack=False)
    assert slow.decode_stack is None
    return fast, slow, KVCacheManager(BlockAllocator(64))


def test_stack_logits_equal_the_layer_by_layer_path(model, tokenizer):
    fast, slow, manager = runner_pair(model)
    # Contexts within one block, across two, across three.
    seqs, held = prefill_prompts(slow, manager, tokenizer, [5, 17, 40], first_seed=300)
    for step in range(3):
        new = [2000 + 11 * step + i for i in range(len(seqs))]
        batch = [SequenceStep([t], len(ids), blocks.tables, True)
                 for t, ids, blocks in zip(new, seqs, held, strict=True)]
        # Both write the same K/V into the same slots, so running the reference second over
        # the stack's writes checks the writes too.
        stacked = fast.compute_logits(batch)
        reference = slow.compute_logits(batch)
        diff = (stacked - reference).abs().max().item()
        print(f"decode step {step}, batch {len(batch)}: max |stack - layers| = {diff:.1e}")
        assert torch.equal(stacked, reference)
        seqs = [[*ids, t] for ids, t in zip(seqs, new, strict=True)]


def test_the_engine_reports_the_stack(model):
    fast, _, _ = runner_pair(model)
    assert fast.decode_stack is not None and unsupported(model) is None


def test_models_the_stack_cannot_run_are_named(model):
    qk_norm = copy.copy(model)
    qk_norm.cfg = dataclasses.replace(model.cfg, qk_norm=True)
    assert unsupported(qk_norm) == "q/k norms"
    gemma = copy.copy(model)
    gemma.cfg = dataclasses.replace(model.cfg, model_type="gemma3_text")
    assert unsupported(gemma) == "architecture gemma3_text"

    plain = copy.deepcopy(model)  # PyTorch matmuls and small ops, as on other devices
    plain.layers[0].mlp.down_proj = Linear(model.cfg.intermediate_size, model.cfg.hidden_size)
    assert unsupported(plain) == "down runs on PyTorch's matmul"
    use_fused_ops(plain, None)
    assert unsupported(plain) == "the fused small ops are not built"
    pool = KVCachePool(model.cfg.num_layers, 4, model.cfg.num_kv_heads, model.cfg.head_dim)
    assert DecodeStack.build(plain, pool) is None
    assert ModelRunner(model, pool, "torch").decode_stack is None  # it needs the kernel
