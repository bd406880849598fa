"""The batched sampler's maths: temperature, top-k, top-p, and seeded draws."""

from __future__ import annotations

import torch

from engine.request import Request, SamplingParams
from engine.sampler import Sampler, top_k_top_p


def request(**params) -> Request:
    return Request("r", [1, 2, 3], SamplingParams(**params), on_output=lambda out: None)


def test_top_k_keeps_exactly_the_k_most_likely():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0, -1.0]])
    probs = top_k_top_p(logits, torch.tensor([2]), torch.tensor([1.0]))
    expected = torch.softmax(torch.tensor([3.0, 2.0]), dim=0)
    print("top_k=2:", probs.tolist())
    assert torch.allclose(probs[0, [1, 3]], expected)
    assert probs[0, [0, 2, 4]].sum() == 0


def test_top_p_keeps_the_smallest_set_reaching_p():
    # probabilities 0.5, 0.3, 0.15, 0.05
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    cases = ((0.5, [0]), (0.51, [0, 1]), (0.79, [0, 1]), (0.81, [0, 1, 2]), (1.0, [0, 1, 2, 3]))
    for p, kept in cases:
        probs = top_k_top_p(logits, torch.tensor([0]), torch.tensor([p]))
        nonzero = probs[0].nonzero().flatten().tolist()
        print(f"top_p={p}: kept {nonzero}")
        assert nonzero == kept
        assert torch.isclose(probs.sum(), torch.tensor(1.0))


def test_rows_get_their_own_top_k_and_top_p():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0]] * 3)  # probabilities 0.64, 0.24, 0.09, 0.03
    probs = top_k_top_p(logits, torch.tensor([1, 0, 3]), torch.tensor([1.0, 0.7, 1.0]))
    kept = [row.nonzero().flatten().tolist() for row in probs]
    print("per-row kept:", kept)
    assert kept == [[0], [0, 1], [0, 1, 2]]


def test_sampling_never_leaves_the_nucleus_and_follows_the_distribution():
    """Would fail if top_p were ignored: token 3 has 10% of the mass outside the nucleus."""
    logits = torch.tensor([0.6, 0.3, 0.1]).log()
    sampler = Sampler()
    reqs = [request(temperature=1.0, top_p=0.85, seed=i) for i in range(2000)]
    tokens = sampler(logits.expand(len(reqs), -1).clone(), reqs)
    counts = torch.bincount(torch.tensor(tokens), minlength=3)
    print("counts with top_p=0.85 over [0.6, 0.3, 0.1]:", counts.tolist())
    assert counts[2] == 0
    # Renormalized nucleus: 2/3 and 1/3; 2000 draws put the share within ~0.05 of 2/3.
    assert abs(counts[0].item() / 2000 - 2 / 3) < 0.05


def test_temperature_sharpens_and_greedy_rows_take_the_argmax():
    logits = torch.tensor([[1.0, 2.0, 0.5]])
    cold = Sampler.probabilities(logits, [request(temperature=0.1)])
    warm = Sampler.probabilities(logits, [request(temperature=2.0)])
    print("p(top) at T=0.1:", cold[0, 1].item(), "at T=2:", warm[0, 1].item())
    assert cold[0, 1] > 0.99 and warm[0, 1] < 0.6
    mixed = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 1.0]])
    assert Sampler()(mixed, [request(temperature=0), request(temperature=0)]) == [1, 0]


def test_a_seeded_row_does_not_depend_on_its_batch():
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    alone = Sampler()(logits[2:3].clone(), [request(temperature=1.0, seed=7)])
    batch = [request(temperature=1.0, seed=s) for s in (1, 2, 7, 3)]
    together = Sampler()(logits, batch)
    print("alone:", alone, "in a batch:", together)
    assert together[2] == alone[0]
