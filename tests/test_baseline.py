"""The baseline (baseline_server.py) against Hugging Face, and its padding against no padding.

The baseline is the yardstick the engine is measured against, so it must compute the same
thing: the same greedy tokens as transformers' `generate`, whether users decode alone, in a
padded batch, or join while others are mid-decode.
"""

from __future__ import annotations

import threading

import pytest
import torch

from baseline_server import (
    FIXED,
    REFUSED,
    BaselineEngineCore,
    BaselineRunner,
    PaddedDecodeAttention,
    UserKV,
    parse_args,
)
from engine.batch_engine import BatchEngine
from engine.config import EngineConfig
from engine.request import Request, RequestOutput, SamplingParams
from model.llama import causal_attention
from tests.conftest import LOGITS_ATOL, PROMPTS

MAX_NEW = 12
WAIT_S = 60  # generous: the machine is shared; a healthy run takes a few seconds


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    """Prompts of different lengths, plus a chat turn the model ends (EOS) after 2 tokens,
    so ignore_eos is exercised: the baseline must carry on past EOS like `generate` below."""
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Say just the word yes."}],
                                         tokenize=False, add_generation_prompt=True)
    return ([tokenizer(p).input_ids for p in PROMPTS]
            + [tokenizer(chat, add_special_tokens=False).input_ids])


def hf_greedy(hf_model, ids: list[int], max_new: int) -> list[int]:
    """transformers' greedy `generate`, not stopping at EOS (as ignore_eos)."""
    out = hf_model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False,
                            eos_token_id=None, attention_mask=torch.ones(1, len(ids),
                                                                         dtype=torch.long))
    return out[0, len(ids):].tolist()


class Collector:
    """Gathers one request's outputs (on the engine thread) and signals the last."""

    def __init__(self, signal_after: int = 1) -> None:
        self.outputs: list[RequestOutput] = []
        self.done = threading.Event()
        self.signal_after = signal_after
        self.reached = threading.Event()  # set once signal_after outputs have arrived

    def __call__(self, output: RequestOutput) -> None:
        self.outputs.append(output)
        if len(self.outputs) >= self.signal_after:
            self.reached.set()
        if output.finished:
            self.done.set()

    def tokens(self) -> list[int]:
        assert self.done.wait(WAIT_S), "the request did not finish in time"
        last = self.outputs[-1]
        assert last.error is None, last.error
        assert last.finish_reason == "length"
        return [t for o in self.outputs for t in o.token_ids]


def submit(engine: BatchEngine, request_id: str, ids: list[int], max_tokens: int,
           signal_after: int = 1) -> Collector:
    collector = Collector(signal_after)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    engine.add_request(Request(request_id, ids, params, on_output=collector))
    return collector


def compare(label: str, ours: list[int], theirs: list[int]) -> None:
    print(f"{label}: baseline {ours}\n{' ' * len(label)}        hf {theirs}")
    assert ours == theirs, f"{label}: the baseline differs from Hugging Face generate"


@pytest.fixture
def engine(model, tokenizer):
    engine = BatchEngine(EngineConfig(max_num_seqs=8), model, tokenizer, BaselineEngineCore)
    yield engine
    engine.shutdown()


def test_padded_batch_matches_hf_generate(engine, hf_model, prompts):
    # All submitted before the thread starts: seated in one round, then decoded as one
    # padded batch of users with different lengths.
    collectors = [submit(engine, f"r{i}", ids, MAX_NEW) for i, ids in enumerate(prompts)]
    engine.start()
    print("prompt lengths:", [len(ids) for ids in prompts])
    for i, (ids, collector) in enumerate(zip(prompts, collectors)):
        compare(f"request {i}", collector.tokens(), hf_greedy(hf_model, ids, MAX_NEW))
    assert engine.stats()["running"] == 0 and not engine.core.caches


def test_request_joining_mid_decode_matches_hf_generate(engine, hf_model, prompts):
    early_new = 16
    early = [submit(engine, f"early{i}", prompts[i], early_new, signal_after=3) for i in (0, 2)]
    engine.start()
    # Wait until the early users are decoding, then join with a prompt of another length.
    assert early[0].reached.wait(WAIT_S)
    late = submit(engine, "late", prompts[1], MAX_NEW)
    assert late.reached.wait(WAIT_S)
    seen = len(early[0].outputs)
    print(f"the late request got its first token when the first early one had {seen} tokens")
    assert not early[0].done.is_set() and seen < early_new  # it joined mid-decode
    compare("late", late.tokens(), hf_greedy(hf_model, prompts[1], MAX_NEW))
    for i, collector in zip((0, 2), early):
        compare(f"early {i}", collector.tokens(), hf_greedy(hf_model, prompts[i], early_new))


def test_padded_decode_logits_equal_each_user_alone(model, prompts):
    runner = BaselineRunner(model)
    users = [prompts[i] for i in (0, 2, 3)]  # 5, 25 and 18 tokens with SmolLM2's tokenizer
    prefilled = [runner.prefill(ids) for ids in users]
    tokens = [int(logits[0].argmax()) for logits, _ in prefilled]
    caches = [cache for _, cache in prefilled]
    alone_caches = [UserKV(list(c.k), list(c.v)) for c in caches]  # decode() replaces lists

    batched = runner.decode(caches, tokens)  # padded to the longest of 3 lengths
    for i, (ids, cache) in enumerate(zip(users, alone_caches)):
        alone = runner.decode([cache], [tokens[i]])[0]  # batch of one: no padding at all
        full = model(torch.tensor([[*ids, tokens[i]]]), torch.arange(len(ids) + 1)[None],
                     causal_attention)[0, -1]  # no cache: the whole sequence recomputed
        d_alone = (batched[i] - alone).abs().max().item()
        d_full = (batched[i] - full).abs().max().item()
        print(f"user {i} ({len(ids)} prompt tokens): padded vs alone {d_alone:.2e}, "
              f"padded vs full recompute {d_full:.2e}")
        assert d_alone <= LOGITS_ATOL
        assert d_full <= LOGITS_ATOL
        # Both caches grew by one token: the same past, and (nearly) the same new K/V.
        assert caches[i].length == cache.length == len(ids) + 1
        for layer in range(model.cfg.num_layers):
            for padded_kv, alone_kv in ((caches[i].k[layer], cache.k[layer]),
                                        (caches[i].v[layer], cache.v[layer])):
                assert torch.equal(padded_kv[:-1], alone_kv[:-1])
                assert (padded_kv[-1] - alone_kv[-1]).abs().max() <= LOGITS_ATOL


def test_padded_attention_equals_each_user_alone():
    """The attention callable alone, on random K/V: padding and masking change nothing."""
    torch.manual_seed(0)
    heads, kv_heads, dim, lengths = 9, 3, 64, [5, 17, 1]

    def cache(n: int) -> UserKV:
        return UserKV([torch.randn(n, kv_heads, dim)], [torch.randn(n, kv_heads, dim)])

    caches = [cache(n) for n in lengths]
    q = torch.randn(len(lengths), 1, heads, dim)
    k, v = torch.randn(len(lengths), 1, kv_heads, dim), torch.randn(len(lengths), 1, kv_heads, dim)
    batched = PaddedDecodeAttention(caches, torch.device("cpu"))(0, q, k, v)
    for i, n in enumerate(lengths):
        alone = PaddedDecodeAttention([caches[i]], torch.device("cpu"))(
            0, q[i:i + 1], k[i:i + 1], v[i:i + 1])
        diff = (batched[i] - alone[0]).abs().max().item()
        print(f"user {i} ({n} past tokens, padded to {max(lengths) + 1}): max diff {diff:.2e}")
        assert diff <= 1e-5


def test_logprobs_samples_and_prompt_scores_match_the_engine(model, tokenizer):
    """The baseline serves the same API: n (independent samples here), logprobs, prompt
    logprobs and max_tokens 0 give what the paged engine gives."""
    from tests.engine.test_logprobs import drive

    ids = tokenizer(PROMPTS[0]).input_ids
    results = []
    for core in (BaselineEngineCore, None):
        config = EngineConfig(num_blocks=64)
        engine = (BatchEngine(config, model, tokenizer, core) if core
                  else BatchEngine(config, model, tokenizer))
        sampled = drive(engine, [Request("a", ids, SamplingParams(
            max_tokens=3, temperature=0, logprobs=2, prompt_logprobs=1, n=2), print)])
        scored = drive(engine, [Request("b", ids, SamplingParams(
            max_tokens=0, temperature=0, prompt_logprobs=1), print)])
        results.append((
            [[e for o in sampled[i] for e in o.logprobs] for i in (0, 1)],
            next(o.prompt_logprobs for o in sampled[0] if o.prompt_logprobs)[1:],
            scored[0][-1].prompt_logprobs[1:], scored[0][-1].token_ids))
    (base_samples, base_prompt, base_scored, base_ids), (samples, prompt, scored, ids_) = results
    diff = max(abs(a.logprob - b.logprob) for a, b in zip(
        [*base_samples[0], *base_samples[1], *base_prompt, *base_scored],
        [*samples[0], *samples[1], *prompt, *scored], strict=True))
    print(f"baseline vs engine: tokens {[e.token_id for e in base_samples[0]]} vs "
          f"{[e.token_id for e in samples[0]]}; max logprob difference {diff:.2e}")
    assert [[e.token_id for e in s] for s in base_samples] == [
        [e.token_id for e in s] for s in samples]
    assert base_samples[0] and base_ids == ids_ == []
    assert diff <= LOGITS_ATOL


# Each flag the baseline refuses, as someone would give it (the value is a valid one for
# server.py, so only the baseline's refusal can fail it).
REFUSED_FLAGS = {
    "num_blocks": ["--num-blocks", "64"],
    "kv_cache_memory": ["--kv-cache-memory", "1GiB"],
    "no_prefix_cache": ["--no-prefix-cache"],
    "max_num_batched_tokens": ["--max-num-batched-tokens", "1024"],
    "max_prefills_per_step": ["--max-prefills-per-step", "1"],
    "attention": ["--attention", "torch"],
    "single_thread_below": ["--single-thread-below", "0"],
    "speculative_config": ["--speculative-config", '{"method": "ngram"}'],
    "priority_aging": ["--priority-aging", "0"],
    "matmul": ["--matmul", "auto"],
    "weights": ["--weights", "int8"],
    "activations": ["--activations", "int8"],
    "lm_head": ["--lm-head", "q8_0"],
    "scheduling_policy": ["--scheduling-policy", "priority"],
}


def test_every_unhonoured_flag_is_listed_for_the_test():
    assert set(REFUSED_FLAGS) == set(REFUSED) | set(FIXED)


@pytest.mark.parametrize("dest", sorted(REFUSED_FLAGS))
def test_a_flag_the_baseline_does_not_honour_is_refused(dest, capsys):
    argv = REFUSED_FLAGS[dest]
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    message = capsys.readouterr().err.strip().splitlines()[-1]
    print(argv, "->", message)
    assert exit_info.value.code == 2
    assert f"error: {argv[0]}" in message and "not supported by the baseline" in message
    why = REFUSED[dest] if dest in REFUSED else FIXED[dest][1]
    assert message.endswith(why)


def test_flags_it_honours_or_runs_with_are_taken():
    args = parse_args(["--threads", "1", "--max-num-seqs", "600", "--matmul", "torch",
                       "--weights", "default", "--scheduling-policy", "fcfs", "--dtype",
                       "bfloat16", "--max-waiting", "5", "--request-timeout", "9"])
    config = EngineConfig.from_args(args)  # the seats above 512 need no token budget flag
    print(config)
    assert (config.threads, config.max_num_seqs, config.dtype, config.max_waiting,
            config.request_timeout) == (1, 600, "bfloat16", 5, 9.0)


def test_threads_sets_the_threads_every_step_runs_on(model, tokenizer):
    """--threads is honoured: a step runs on that many threads (on the thread that steps:
    PyTorch's setting is per thread), whatever its size. Without it, PyTorch's default."""
    before = torch.get_num_threads()
    ids = tokenizer(PROMPTS[0]).input_ids
    try:
        for threads in (1, 2):
            torch.set_num_threads(3)
            core = BaselineEngineCore(EngineConfig(threads=threads), model,
                                      [tokenizer.eos_token_id])
            core.add(Request(f"t{threads}", ids, SamplingParams(max_tokens=2), print))
            core.step()  # the prefill
            print(f"--threads {threads}: {torch.get_num_threads()} threads after a step; "
                  f"{core.describe()}")
            assert torch.get_num_threads() == threads
            assert core.describe().endswith(f"{threads} threads")
        torch.set_num_threads(3)
        core = BaselineEngineCore(EngineConfig(), model, [tokenizer.eos_token_id])
        core.add(Request("default", ids, SamplingParams(max_tokens=2), print))
        core.step()
        assert torch.get_num_threads() == 3  # left alone
    finally:
        torch.set_num_threads(before)
