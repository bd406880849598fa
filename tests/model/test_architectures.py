"""Llama with llama3 rope scaling, Qwen2, Qwen3 and Gemma 3 against Hugging Face, on tiny
random models.

Each model is made with transformers' own config class, its weights drawn large enough that
the logits are far from uniform, saved with save_pretrained and loaded through our loader
(with our CPU kernels where they run). Its logits must equal Hugging Face's on the full
prompt, through the paged cache (decode, prefix hit, chunks), and the engine's greedy answers
must equal `generate`'s, also with the prefix cache, chunked prefill and preemption.
The tokenizer is the default model's (49152 ids): the tiny models share its vocabulary.
Gemma 3's has a sliding window of 12 tokens on two of its three layers, shorter than most
prompts here, so a window applied wrongly (or not at all) changes the logits.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from engine.step_types import SequenceStep
from kvcache.kv_cache_manager import SequenceBlocks
from kvcache.pool import BLOCK_SIZE, DUMMY_BLOCK
from model.config import Llama3RopeScaling, ModelConfig
from model.layers import causal_attention, llama3_scaled
from model.loader import load_model
from tests.conftest import LOGITS_ATOL
from tests.engine.test_engine import SYSTEM, check, make_engine, record_step_tokens, run
from tests.model.test_paged_attention import (
    BACKENDS,
    check_paged_decode,
    hf_last_logits,
    make_runner,
    prompt_ids,
)

torch.set_grad_enabled(False)

VOCAB = 49152  # the default model's tokenizer
SHAPE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
             rms_norm_eps=1e-6)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               # short, so that all three bands of frequencies occur at head_dim 16
               "original_max_position_embeddings": 32}


GEMMA3_WINDOW = 12


def hf_config(name: str):
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen2Config, Qwen3Config

    if name == "gemma3":
        # Gemma 3 270M's attention shape (one K/V head of dim 256), a query scale that is not
        # head_dim's, and a logit cap (the released models have none) to test it.
        shape = {**SHAPE, "num_hidden_layers": 3, "num_key_value_heads": 1}
        return Gemma3TextConfig(**shape, head_dim=256, sliding_window=GEMMA3_WINDOW,
                                sliding_window_pattern=3, query_pre_attn_scalar=64,
                                final_logit_softcapping=30.0, tie_word_embeddings=True)
    if name == "llama3":
        return LlamaConfig(**SHAPE, rope_scaling=LLAMA3_ROPE, tie_word_embeddings=False)
    if name == "qwen2":
        return Qwen2Config(**SHAPE, rope_theta=1e6, tie_word_embeddings=True)
    # head_dim 32 is not hidden / heads (16): the projections are 64 -> 128 -> 64.
    return Qwen3Config(**SHAPE, head_dim=32, rope_theta=1e6, tie_word_embeddings=False)


def save_tiny(name: str, folder: Path) -> torch.nn.Module:
    """A tiny random model of one architecture, saved to `folder`; the Hugging Face model."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(hf_config(name), dtype=torch.float32)
    for param_name, param in hf.named_parameters():
        if param_name.endswith("norm.weight"):  # norm gains around 1, everything else around 0
            param.copy_(1 + 0.3 * torch.randn_like(param))
        else:
            param.normal_(0, 0.3)
    hf.save_pretrained(folder)
    return hf.eval()


@pytest.fixture(scope="module", params=["llama3", "qwen2", "qwen3", "gemma3"])
def tiny(request, tmp_path_factory) -> tuple[str, Path, torch.nn.Module]:
    """(name, folder, Hugging Face model) of one tiny random architecture."""
    folder = tmp_path_factory.mktemp(request.param)
    return request.param, folder, save_tiny(request.param, folder)


@pytest.fixture(scope="module")
def ours(tiny):
    return load_model(tiny[1])


@pytest.fixture(scope="module")
def hf(tiny):
    return tiny[2]


def test_config_reads_the_architecture(tiny, ours):
    cfg = ours.cfg
    kind = tiny[0]
    assert cfg.model_type == {"llama3": "llama", "gemma3": "gemma3_text"}.get(kind, kind)
    assert cfg.qkv_bias == (kind == "qwen2")
    assert cfg.qk_norm == (kind in ("qwen3", "gemma3"))
    assert cfg.head_dim == {"qwen3": 32, "gemma3": 256}.get(kind, 16)
    assert (cfg.rope_scaling is not None) == (kind == "llama3")
    if kind == "llama3":
        assert cfg.rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 32)
    if kind == "gemma3":
        assert cfg.sliding_layers == (True, True, False)
        assert [cfg.layer_window(i) for i in range(3)] == [GEMMA3_WINDOW, GEMMA3_WINDOW, None]
        assert (cfg.rope_theta, cfg.rope_local_theta) == (1e6, 1e4)
        assert cfg.query_pre_attn_scalar == 64 and cfg.final_logit_softcapping == 30.0
    else:
        assert cfg.sliding_window is None and not any(cfg.sliding_layers)


def test_full_prompt_logits_match_hf(ours, hf, tokenizer):
    ids = torch.tensor([prompt_ids(tokenizer, 60, seed=1)])
    positions = torch.arange(ids.shape[1]).unsqueeze(0)
    theirs = hf(ids).logits[0]
    mine = ours(ids, positions, causal_attention)[0]
    diff = (mine - theirs).abs().max().item()
    spread = theirs.std(dim=-1).min().item()
    print(f"{ours.cfg.model_type}: 60-token prefill, max |diff| vs HF = {diff:.2e}; "
          f"logits std per position >= {spread:.2f}")
    assert spread > 1.0, "logits too close to uniform to tell a wrong model apart"
    assert diff < LOGITS_ATOL
    if ours.cfg.sliding_window:  # the window matters: ignoring it gives other logits

        def whole_context(layer_idx, q, k, v, window=None):
            return causal_attention(layer_idx, q, k, v)

        unwindowed = ours(ids, positions, whole_context)[0]
        gap = (unwindowed - theirs).abs().max().item()
        print(f"without the window of {ours.cfg.sliding_window}: max |diff| = {gap:.2e}")
        assert gap > 100 * LOGITS_ATOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_paged_decode_logits_match_hf(ours, hf, tokenizer, backend):
    runner, manager = make_runner(ours, backend=backend)
    check_paged_decode(runner, manager, hf, tokenizer, [3, 17, 40], backend, first_seed=10)


def test_prefix_hit_and_chunks_match_hf_logits(ours, hf, tokenizer):
    runner, manager = make_runner(ours)
    shared = prompt_ids(tokenizer, 2 * BLOCK_SIZE, seed=7)
    first, second = [*shared, 11, 12, 13], [*shared, 21, 22, 23, 24, 25]
    a = SequenceBlocks()
    assert manager.allocate_slots(a, len(first))
    pos = 0
    for size in (13, len(first) - 13):  # the first one prefilled in two chunks
        runner_out = runner.compute_logits(
            [SequenceStep(first[pos:pos + size], pos, a.tables, pos + size == len(first))])
        pos += size
        # As the scheduler does after a step: sliding groups give back what they left behind.
        manager.cache_full_blocks(a, first, pos)
        manager.free_left_behind(a, pos)
    diff = (runner_out[0] - hf_last_logits(hf, first)).abs().max().item()
    print(f"chunked prefill: |diff| vs HF = {diff:.2e}")
    assert diff < LOGITS_ATOL
    b = manager.find_cached_prefix(second)
    cached = len(b.block_table) * BLOCK_SIZE
    assert cached == 2 * BLOCK_SIZE
    check_hit_against_hf(runner, manager, hf, b, second, f"prefix hit ({cached} tokens reused)")


def check_hit_against_hf(runner, manager, hf, hit: SequenceBlocks, ids: list[int],
                         label: str) -> None:
    """Take the prefix hit `hit` for `ids`, compute the rest, and compare the last logits
    with Hugging Face's."""
    cached = len(hit.hashes) * BLOCK_SIZE
    assert manager.allocate_slots(hit, len(ids), new_prefix_hit=True)
    logits = runner.compute_logits([SequenceStep(ids[cached:], cached, hit.tables, True)])
    diff = (logits[0] - hf_last_logits(hf, ids)).abs().max().item()
    print(f"{label}: |diff| vs HF = {diff:.2e}")
    assert diff < LOGITS_ATOL


@pytest.mark.parametrize("tiny", ["gemma3"], indirect=True)  # the one with windows
def test_hit_without_a_sliding_block_is_shorter_and_matches_hf_logits(ours, hf, tokenizer):
    assert ours.cfg.sliding_window
    runner, manager = make_runner(ours)
    allocator, sliding = manager.allocator, [g for g, _ in manager.sliding]
    shared = prompt_ids(tokenizer, 3 * BLOCK_SIZE, seed=8)
    first, second = [*shared, 11, 12], [*shared, 21, 22, 23]
    a = SequenceBlocks()
    assert manager.allocate_slots(a, len(first))
    runner.compute_logits([SequenceStep(first, 0, a.tables, True)])
    manager.cache_full_blocks(a, first, len(first))
    manager.free_left_behind(a, len(first))
    manager.release(a)  # all cached-free now
    hit = manager.find_cached_prefix(second)
    assert len(hit.hashes) == 3 and all(hit.tables[g][0] == DUMMY_BLOCK for g in sliding)
    # Evict block 2 of one sliding group: a hit of 3 blocks needs it (the next query, at 48,
    # sees 37..48); one of 2 blocks needs only block 1 (the query at 32 sees 21..32).
    gone = hit.tables[sliding[-1]][2]
    allocator.acquire(gone)
    allocator._forget(allocator.blocks[gone])
    allocator.free(gone)
    b = manager.find_cached_prefix(second)
    cached = len(b.hashes) * BLOCK_SIZE
    print(f"hit without block 2 of group {sliding[-1]}: {cached} tokens, tables {b.tables}")
    assert cached == 2 * BLOCK_SIZE
    check_hit_against_hf(runner, manager, hf, b, second, "shortened prefix hit")
    manager.release(b)
    allocator.check_invariants()


# --- the engine: greedy answers against generate ---------------------------------------------

MAX_NEW = 10
QUESTIONS = ["The cat sat on the", "Paris is the capital of", "List three prime numbers:",
             "def add(a, b):\n    return", "Water boils at a temperature of",
             "In the year 2050, cities will"]


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    return [tokenizer(SYSTEM + q if i % 2 else q).input_ids for i, q in enumerate(QUESTIONS)]


@pytest.fixture(scope="module")
def hf_answers(hf, prompts) -> list[list[int]]:
    """generate's greedy continuations, to the full length (the tiny models have no EOS)."""
    answers = []
    for ids in prompts:
        out = hf.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False,
                          attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          eos_token_id=None, pad_token_id=0)
        answers.append(out[0, len(ids):].tolist())
    assert all(len(a) == MAX_NEW for a in answers)
    return answers


def test_engine_matches_generate_with_prefix_hits(ours, tokenizer, prompts, hf_answers):
    engine = make_engine(ours, tokenizer, num_blocks=64)
    tokens, requests = run(engine, prompts, [0, 0, 1, 3, 3, 5], max_tokens=MAX_NEW,
                           ignore_eos=True)
    check(tokens, hf_answers, ours.cfg.model_type)
    hits = sum(r.num_cached_tokens for r in requests)
    print(f"prefix cache: {hits} prompt tokens reused")
    assert hits > 0
    assert engine.core.allocator.num_used == 0


def test_engine_chunked_prefill_matches_generate(ours, tokenizer, prompts, hf_answers):
    engine = make_engine(ours, tokenizer, num_blocks=64, max_num_seqs=3,
                         max_num_batched_tokens=8)
    budgets = record_step_tokens(engine)
    tokens, _ = run(engine, prompts, [0] * len(prompts), max_tokens=MAX_NEW, ignore_eos=True)
    check(tokens, hf_answers, "chunked")
    assert max(budgets) <= 8


def test_engine_preemption_keeps_the_answers(ours, tokenizer, prompts, hf_answers):
    roomy = make_engine(ours, tokenizer, num_blocks=64)
    expected, _ = run(roomy, prompts, [0] * len(prompts), max_tokens=24, ignore_eos=True)
    # 8 blocks (7 usable, 112 tokens) for 6 users of 5-42 prompt tokens and 24 new each,
    # none shared: someone must yield.
    tiny_pool = make_engine(ours, tokenizer, num_blocks=8, max_num_seqs=6,
                            enable_prefix_cache=False)
    tokens, requests = run(tiny_pool, prompts, [0] * len(prompts), max_tokens=24,
                           ignore_eos=True)
    preemptions = sum(r.num_preemptions for r in requests)
    print(f"tiny pool: {preemptions} preemptions")
    assert preemptions > 0
    check(tokens, expected, "preempted")
    check([t[:MAX_NEW] for t in tokens], hf_answers, "preempted vs hf")
    assert tiny_pool.core.allocator.num_used == 0
    tiny_pool.core.allocator.check_invariants()


def count_left_behind(engine) -> list[int]:
    """A list that gets, after each step, the blocks the seated requests' sliding groups
    have given back; every step also checks that the pool's count of blocks in use is the
    blocks the seated requests hold (what a window left behind is counted nowhere)."""
    core, counts = engine.core, []
    core_step = core.step

    def step_and_count():
        result = core_step()
        running = core.scheduler.running
        counts.append(sum(r.blocks.left_behind[g] for r in running
                          for g in range(core.groups.num_groups)))
        assert core.allocator.num_used == len({b for r in running for b in r.blocks.held()})
        core.allocator.check_invariants()
        return result

    core.step = step_and_count
    return counts


@pytest.mark.parametrize("tiny", ["gemma3"], indirect=True)  # the one with windows
def test_engine_gives_back_the_blocks_a_window_left_behind(ours, tokenizer, prompts,
                                                            hf_answers):
    assert ours.cfg.sliding_window
    engine = make_engine(ours, tokenizer, num_blocks=64)
    left_behind = count_left_behind(engine)
    tokens, _ = run(engine, prompts, [0, 0, 1, 3, 3, 5], max_tokens=MAX_NEW, ignore_eos=True)
    check(tokens, hf_answers, "window given back")
    print(f"{engine.core.describe()}\nblocks given back after each step: {left_behind}")
    assert max(left_behind) > 0
    assert engine.core.allocator.num_used == 0


def test_engine_samples_share_and_give_back_the_window(ours, tokenizer, prompts, hf_answers):
    from engine.request import Request, SamplingParams
    from tests.engine.test_logprobs import drive

    engine = make_engine(ours, tokenizer, num_blocks=64)
    left_behind = count_left_behind(engine)
    longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0, ignore_eos=True, n=3)
    by_sample = drive(engine, [Request("n3", prompts[longest], params, print)])
    answers = [[t for o in by_sample[i] for t in o.token_ids] for i in range(3)]
    check(answers, [hf_answers[longest]] * 3, "samples")
    assert max(left_behind) > 0 or not ours.cfg.sliding_window
    assert engine.core.allocator.num_used == 0


# --- what is refused, and the rope scaling itself --------------------------------------------


def base_config(**changes) -> dict:
    raw = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64,
           "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
    return {**raw, **changes}


@pytest.mark.parametrize(("changes", "message"), [
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope type 'yarn'"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope type 'dynamic'"),
    ({"model_type": "qwen2", "use_sliding_window": True}, "use_sliding_window is true"),
    ({"model_type": "qwen3", "layer_types": ["full_attention", "sliding_attention"]},
     "layers [1]"),
    ({"model_type": "qwen3", "attention_bias": True}, "attention_bias"),
    ({"attention_bias": True}, "attention_bias"),
    ({"mlp_bias": True}, "MLP biases"),
    ({"model_type": "gemma3"}, "'gemma3' is not supported"),
    ({"model_type": "gemma3_text", "attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ({"model_type": "gemma3_text", "hidden_activation": "gelu"}, "hidden_activation 'gelu'"),
    ({"model_type": "gemma3_text", "sliding_window": 512,
      "rope_scaling": {"rope_type": "linear", "factor": 8.0}}, "full_attention rope type 'linear'"),
    ({"model_type": "gemma3_text", "layer_types": ["full_attention", "chunked_attention"]},
     "chunked_attention"),
    ({"model_type": "gemma3_text", "sliding_window_pattern": 2}, "sliding_window is None"),
])
def test_unsupported_configs_are_refused_with_the_reason(changes, message):
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        ModelConfig.from_dict(base_config(**changes))
    print(err.value)
    if "rope" in message and "gemma3" not in changes.get("model_type", ""):
        assert "default, llama3" in str(err.value)


def test_qwen_configs_without_sliding_windows_are_read():
    for kind in ("qwen2", "qwen3"):  # the usual shipped form: a window size, switched off
        cfg = ModelConfig.from_dict(base_config(model_type=kind, use_sliding_window=False,
                                                sliding_window=32768, max_window_layers=21,
                                                rope_theta=1e6))
        assert cfg.rope_theta == 1e6 and cfg.rope_scaling is None


def test_llama3_scaling_keeps_short_waves_shrinks_long_ones_and_blends_between():
    scaling = Llama3RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                original_max_position_embeddings=32)
    # Turns within the original 32 positions: 8 (above 4: kept), 0.5 (below 1: / 8), and 2.5
    # (halfway through the band: half of f / 8 plus half of f).
    inv_freq = torch.tensor([8.0, 0.5, 2.5]) * 2 * torch.pi / 32
    expected = inv_freq * torch.tensor([1.0, 1 / 8, 0.5 / 8 + 0.5])
    torch.testing.assert_close(llama3_scaled(inv_freq, scaling), expected)


def test_int8_refuses_a_model_with_qkv_biases(tmp_path):
    from model.loader import load_int8_model

    save_tiny("qwen2", tmp_path)
    with pytest.raises(ValueError, match="--weights int8 does not quantize qwen2"):
        load_int8_model(tmp_path)


def test_a_bidirectional_gemma3_is_an_encoder_without_a_head():
    cfg = ModelConfig.from_dict(base_config(model_type="gemma3_text", sliding_window=512,
                                            use_bidirectional_attention=True))
    assert cfg.bidirectional
    assert not ModelConfig.from_dict(base_config(model_type="gemma3_text",
                                                 sliding_window=512)).bidirectional
    from model.gemma3 import Gemma3Model

    with torch.device("meta"):
        assert Gemma3Model(cfg).lm_head is None
