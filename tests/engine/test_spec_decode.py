"""Speculative decoding's parts without the model: n-gram drafts, verification (greedy and
rejection sampling, checked statistically), the flag, and the scheduler's bookkeeping of
drafts on a toy pool."""

from __future__ import annotations

import pytest
import torch

from engine.request import FinishReason, Request, SamplingParams, Status
from engine.scheduler import Scheduler
from engine.spec_decode import SpeculativeConfig, propose_ngram, verify
from engine.step_types import RunnerOutput
from kvcache.block_allocator import BlockAllocator
from kvcache.kv_cache_manager import KVCacheManager, blocks_for

CONFIG = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_max=3, prompt_lookup_min=2)


def request(prompt: list[int], **params) -> Request:
    return Request("r", prompt, SamplingParams(**params), on_output=lambda out: None)


def test_ngram_drafts_what_followed_the_latest_longest_match():
    # suffix [2, 3]: matched at 1 (followed by 9 9) and at 5 (followed by 4 5 6 7)
    tokens = [1, 2, 3, 9, 9, 2, 3, 4, 5, 6, 7, 8, 2, 3]
    assert propose_ngram(tokens, CONFIG, 10) == [4, 5, 6, 7]
    assert propose_ngram(tokens, CONFIG, 2) == [4, 5]  # capped (max_tokens, budget)
    # the 3-gram [1, 2, 3] wins over the more recent 2-gram [2, 3]
    tokens = [1, 2, 3, 5, 5, 2, 3, 6, 1, 2, 3]
    assert propose_ngram(tokens, CONFIG, 10) == [5, 5, 2, 3]
    # a match near the end drafts only what follows it
    assert propose_ngram([7, 8, 7, 8], CONFIG, 10) == [7, 8]
    assert propose_ngram([1, 2, 3, 4, 5], CONFIG, 10) == []  # no repeat
    assert propose_ngram([1, 2, 9, 2], CONFIG, 10) == []  # one token is below prompt_lookup_min


def test_speculative_config_takes_vllm_keys_and_rejects_the_rest():
    config = SpeculativeConfig.from_json('{"method": "ngram", "num_speculative_tokens": 3, '
                                         '"prompt_lookup_max": 5, "prompt_lookup_min": 1}')
    assert (config.num_speculative_tokens, config.prompt_lookup_max,
            config.prompt_lookup_min) == (3, 5, 1)
    bad = {'{"method": "eagle"}': "not supported", '{"num_speculative_tokens": 0}': "at least 1",
           '{"prompt_lookup_min": 5, "prompt_lookup_max": 2}': "prompt_lookup_min <=",
           '{"num_draft_tokens": 4}': "unknown keys", "ngram": "not valid JSON",
           '{"num_speculative_tokens": "4"}': "must be an integer", "[4]": "JSON object"}
    for text, message in bad.items():
        with pytest.raises(ValueError, match=message):
            SpeculativeConfig.from_json(text)


def test_greedy_verification_keeps_drafts_up_to_the_first_disagreement():
    logits = torch.full((4, 10), -1.0)
    for row, best in enumerate([5, 6, 1, 8]):  # the target's argmax after each prefix
        logits[row, best] = 3.0
    greedy = request([1], temperature=0)
    assert verify(logits, [5, 6, 7], greedy) == [5, 6, 1]  # third draft wrong: corrected
    assert verify(logits, [5, 6, 1], greedy) == [5, 6, 1, 8]  # all right: a bonus token
    assert verify(logits, [4, 6, 1], greedy) == [5]  # first wrong: a plain decode step


def test_rejection_sampling_keeps_the_target_distribution():
    """n-gram drafts are certain (q = 1 on the draft), so a draft is kept with the target's
    probability of it and otherwise replaced from the rest: each emitted token must be
    distributed as the target says, whatever was drafted. On a 6-token vocabulary, 20,000
    seeded runs; a chi-square statistic over the first token and, where the first draft
    was kept, the second."""
    torch.manual_seed(0)
    logits = torch.randn(3, 6) * 1.5
    sampled = request([1], temperature=0.8, top_k=5, seed=1234)
    target = torch.softmax(sampled.params.temperature ** -1 * logits, dim=-1)
    target = torch.where(logits < logits.topk(5, dim=-1).values[:, -1:], 0.0, target)
    target /= target.sum(dim=-1, keepdim=True)  # what sampling without drafts draws from
    drafts = [int(target[0].argsort(descending=True)[1]), int(target[1].argmax())]
    runs = 20_000
    counts = torch.zeros(2, 6)
    lengths = torch.zeros(4)
    for _ in range(runs):
        tokens = verify(logits, drafts, sampled)
        lengths[len(tokens)] += 1
        counts[0, tokens[0]] += 1
        if tokens[0] == drafts[0]:
            counts[1, tokens[1]] += 1
    for row in range(2):
        n = counts[row].sum()
        expected = target[row] * n
        kept = expected > 0
        chi2 = (((counts[row] - expected)[kept]) ** 2 / expected[kept]).sum().item()
        print(f"token {row}: observed {(counts[row] / n).tolist()}\n"
              f"         target   {target[row].tolist()}; chi2 {chi2:.1f} over {n:.0f} draws")
        assert counts[row][~kept].sum() == 0, "a token outside top-k was emitted"
        assert chi2 < 25.0, "emitted tokens do not follow the target distribution"  # p ~ 1e-4
    print("tokens per step:", {k: int(v) for k, v in enumerate(lengths.tolist()) if v})
    expected_full = target[0, drafts[0]] * target[1, drafts[1]] * runs
    assert abs(lengths[3] - expected_full) < 5 * expected_full.sqrt()  # both kept + bonus


def test_seeded_verification_repeats():
    logits = torch.randn(3, 50)
    first = [verify(logits, [3, 4], request([1], temperature=1.0, seed=7)) for _ in range(2)]
    assert first[0] == first[1]


# --- the scheduler's bookkeeping on a toy pool -------------------------------------------

EOS = 2


def make(num_blocks: int = 20, **spec) -> Scheduler:
    config = SpeculativeConfig(**{"num_speculative_tokens": 4, "prompt_lookup_max": 2,
                                  "prompt_lookup_min": 2, **spec})
    return Scheduler(KVCacheManager(BlockAllocator(num_blocks)), 8, 64, eos_token_ids=[EOS],
                     speculative=config)


def copying(rid: str, length: int = 30, max_tokens: int = 40, phase: int = 0) -> Request:
    """A prompt that repeats itself, so its suffix always has a match to draft from (another
    `phase` gives another first block, so it is not waited for in the prefix cache)."""
    prompt = [100 + (i + phase) % 10 for i in range(length)]
    return Request(rid, prompt, SamplingParams(temperature=0, max_tokens=max_tokens),
                   on_output=lambda out: None)


def step(s: Scheduler, accept: int) -> dict[str, tuple[int, list[int]]]:
    """Schedule, then a made-up verification: each drafting request keeps `accept` drafts
    and gets one more token (50); others get token 50. Returns id -> (tokens, drafts)."""
    out = s.schedule()
    sampled = {rid: [*entry.draft_token_ids[:accept], 50]
               for rid, entry in out.scheduled.items() if entry.reaches_end}
    s.update_from_output(out, RunnerOutput(sampled))
    s.kv.allocator.check_invariants()
    for r in s.running:  # no block beyond what its tokens need
        assert blocks_for(r.num_computed_tokens) <= len(r.blocks.block_table) <= blocks_for(
            r.num_tokens), (r.num_computed_tokens, r.num_tokens, r.blocks.block_table)
    return {rid: (entry.num_tokens, entry.draft_token_ids)
            for rid, entry in out.scheduled.items()}


@pytest.mark.parametrize("accept", [0, 2, 4])
def test_rejected_drafts_are_not_computed_and_their_blocks_are_freed(accept):
    s = make()
    r = copying("a", length=29)
    s.add(r)
    step(s, accept=0)  # prefill: 29 tokens, then token 50 sampled
    assert step(s, accept=0)["a"] == (1, [])  # [108, 50] was never seen: a plain decode
    r.token_ids[-2:] = [104, 105]  # make the suffix match (the made-up model's doing)
    work = step(s, accept=accept)["a"]
    print(f"drafting step: {work}; block table {r.blocks.block_table}")
    assert work == (5, [106, 107, 108, 104])  # after 104 105 at 24: positions 31 to 34
    assert r.num_computed_tokens == 31 + accept  # its last token and the accepted drafts
    drafts = [106, 107, 108, 104]
    assert r.token_ids[31:] == [*drafts[:accept], 50]
    # Drafts at 31-34 took block 2; without accepted ones past position 31 it went back.
    assert len(r.blocks.block_table) == blocks_for(r.num_tokens) == (2 if accept == 0 else 3)


def test_drafts_never_preempt_and_leave_a_block_spare_per_seated_request():
    s = make(num_blocks=6)  # 5 usable
    a, b = copying("a", length=31), copying("b", length=32, phase=5)
    s.add(a)
    s.add(b)
    step(s, accept=0)  # prefills: 2 blocks each; b's next token needs the last free block
    a.token_ids[-2:] = b.token_ids[-2:] = [100, 101]
    work = step(s, accept=4)
    print(f"1 free block, 2 seated: {work}")
    assert work == {"a": (1, []), "b": (1, [])}  # a's drafts would have taken b's block
    assert not any(r.num_preemptions for r in (a, b))


def test_no_drafts_when_more_are_seated_than_disable_by_batch_size():
    s = make(num_blocks=40, disable_by_batch_size=2)
    requests = [copying(f"r{i}", length=20, phase=i) for i in range(3)]
    for r in requests:
        s.add(r)
    step(s, accept=0)
    for r in requests:
        r.token_ids[-2:] = [100, 101]
    assert all(drafts == [] for _, drafts in step(s, accept=4).values())  # 3 seated > 2
    s.finish(requests[2], FinishReason.ABORT)
    for r in requests[:2]:
        r.token_ids[-2:] = [100, 101]
    assert all(drafts for _, drafts in step(s, accept=4).values())  # 2 seated


def test_drafts_stop_at_max_tokens_and_a_stop_token_inside_them_ends_the_request():
    s = make()
    r = copying("a", length=20, max_tokens=3)
    s.add(r)
    step(s, accept=0)
    r.token_ids[-2:] = [108, 109]
    assert step(s, accept=4)["a"][1] == [100]  # 1 output, room for 1 draft + 1 verified
    assert r.status is Status.FINISHED and r.num_output_tokens == 3
    r = copying("b", length=20)
    s.add(r)
    step(s, accept=0)
    r.token_ids[-2:] = [108, 109]
    r.token_ids[12] = EOS  # so the draft (what followed 108 109 at 8) has an EOS
    out = s.schedule()
    drafts = out.scheduled["b"].draft_token_ids
    print("drafts:", drafts)
    assert drafts == [100, 101, EOS, 103]
    s.update_from_output(out, RunnerOutput({"b": [*drafts, 50]}))
    assert r.status is Status.FINISHED and r.token_ids[-1] == EOS  # nothing after the EOS
    assert s.kv.allocator.num_used == 0


def test_drafting_pauses_longer_after_each_failed_draft_and_resumes_on_success():
    s = make(num_blocks=40)
    r = copying("a", length=20, max_tokens=60)
    s.add(r)
    step(s, accept=0)
    drafted = []
    for accept in [0] * 10 + [2, 0]:
        r.token_ids[-2:] = [100, 101]  # a match every step
        drafted.append(bool(step(s, accept=accept)["a"][1]))
    print("drafted per step:", drafted)
    # Failures pause 1, 2, 4 steps; the draft after the third pause is accepted, so the
    # next one is tried at once.
    assert drafted == [True, False, True, False, False, True, False, False, False, False,
                       True, True]


def test_a_prompt_with_samples_to_fork_is_not_drafted_past():
    """n=2 and a prompt whose last token comes alone (a chunk of the budget before it): that
    step computes the last token only and forks the sample from its logits, rather than
    draft past the prompt's end, which would fork the sample mid-answer."""
    s = make(num_blocks=20)
    r = copying("a", length=65)
    r.pending_forks = [r.fork(1)]
    s.add(r)
    assert step(s, accept=0) == {"a": (64, [])}
    assert step(s, accept=0) == {"a": (1, []), "a#1": (0, [])}
