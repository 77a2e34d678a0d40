"""Speculative sampling reproduces the target's distribution: chi-square tests of the first and second
emitted tokens against exact marginals, for a model drafter (real q) and a deterministic drafter (q one-hot)."""

from __future__ import annotations

import pytest
import torch

import fastdecode
from fastdecode.engine import encode_batch
from fastdecode.registry import RunContext
from fastdecode.spec.drafters.draft_model import DraftModelConfig, ModelDrafter
from fastdecode.spec.loop import BaseDrafter, Draft, SpecConfig, speculative
from fastdecode.spec.verify import target_distribution

N = 800  # draws per test: identical prompts in one batch, rows draw one after another from one generator
PROCESSORS = dict(temperature=1.0, top_k=16)


def chi_square_p_value(samples: list[int], p: torch.Tensor) -> float:
    """Pearson's test of samples against `[V]` probabilities; cells expecting < 5 draws are pooled."""
    counts = torch.bincount(torch.tensor(samples), minlength=p.numel()).double()
    assert counts[p == 0].sum() == 0, "drew a token the target gives probability 0"
    expected = len(samples) * p.double()
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2))  # chi2 survival


@pytest.fixture(scope="module")
def near_draft(causal_dir):
    """The target with a perturbed output head: q overlaps p by about half, so both paths are common."""
    draft = fastdecode.load(causal_dir)
    head = draft.model.lm_head.weight
    with torch.no_grad():
        head.add_(0.1 * torch.randn(head.shape, generator=torch.Generator().manual_seed(0)))
    return draft


@pytest.fixture(scope="module")
def prompt(causal):
    return causal.encode("the quick brown fox")


def next_distribution(model, ids: torch.Tensor) -> torch.Tensor:
    """`[B, L]` prompts (same length) -> `[B, V]` processed next-token distributions."""
    L = ids.shape[1]
    logits = model.forward(ids, torch.arange(L).expand_as(ids))[:, -1]
    return target_distribution(logits, PROCESSORS["temperature"], PROCESSORS["top_k"])


@pytest.fixture(scope="module")
def marginals(causal, prompt):
    """Exact distributions of the first generated token, and of the second given that the first is not EOS."""
    p1 = next_distribution(causal, torch.tensor([prompt]))[0]  # [V]
    support = [x for x in p1.nonzero().squeeze(-1).tolist() if x not in causal.eos_token_ids]
    ids = torch.cat([torch.tensor([prompt]).expand(len(support), -1), torch.tensor(support)[:, None]], 1)
    weights = p1[support] / p1[support].sum()
    p2 = (weights[:, None] * next_distribution(causal, ids)).sum(0)  # [V] = sum_x p1(x | not EOS) p(. | x)
    return p1, p2


def first_two(outputs: list[list[int]]) -> tuple[list[int], list[int]]:
    """First tokens of every output; second tokens of those that did not stop at EOS."""
    return [o[0] for o in outputs], [o[1] for o in outputs if len(o) > 1]


def test_model_drafter_sampling_matches_the_target(causal, near_draft, prompt, marginals):
    results = fastdecode.generate(causal, [prompt] * N, "spec.draft_model", draft=near_draft, seed=11,
                                  max_new_tokens=2, num_draft_tokens=2, **PROCESSORS)
    assert sum(r.stats.proposed for r in results) >= N
    accepted = sum(r.stats.accepted for r in results)
    assert 0.1 * N < accepted < 0.9 * N  # both the acceptance and the residual path are exercised
    first, second = first_two([r.token_ids for r in results])
    assert chi_square_p_value(first, marginals[0]) > 1e-3
    assert chi_square_p_value(second, marginals[1]) > 1e-3  # bonus, or the next step after a rejection


def test_deterministic_drafter_sampling_matches_the_target(causal, prompt, marginals):
    """The target's own greedy drafts, verified as q one-hot, inside the driver."""
    cfg = SpecConfig(max_new_tokens=2, seed=12, **PROCESSORS)
    batch = encode_batch(causal, [prompt] * N, cfg.max_new_tokens)
    greedy_self = lambda generator: ModelDrafter(causal, DraftModelConfig(num_draft_tokens=2), None)  # noqa: E731
    rows: list[dict[int, int]] = [{} for _ in range(N)]
    accepted = 0
    for event in speculative(causal, batch, cfg, RunContext(), greedy_self):
        accepted += sum(event.accepted)
        for b, pairs in enumerate(event.tokens):
            rows[b].update(pairs)
    assert 0.05 * N < accepted < 0.9 * N
    first, second = first_two([[row[i] for i in sorted(row)] for row in rows])
    assert chi_square_p_value(first, marginals[0]) > 1e-3
    assert chi_square_p_value(second, marginals[1]) > 1e-3


class TopTwoTree(BaseDrafter):
    """A deterministic depth-2 tree: the target's two likeliest tokens, each followed by its two likeliest."""

    def __init__(self, model) -> None:
        self.model = model

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        first = self._top2(context[None])[0]  # [2]
        if k < 2:
            return Draft(first, parents=[-1, -1])
        second = self._top2(torch.cat([context.expand(2, -1), first[:, None]], 1))  # [2, 2]
        return Draft(torch.cat([first, second.flatten()]), parents=[-1, -1, 0, 0, 1, 1])

    def _top2(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.forward(ids, torch.arange(ids.shape[1]).expand_as(ids))[:, -1].topk(2).indices


def test_tree_sampling_in_the_driver_matches_the_target(causal, prompt, marginals):
    cfg = SpecConfig(max_new_tokens=3, seed=13, **PROCESSORS)
    batch = encode_batch(causal, [prompt] * N, cfg.max_new_tokens)
    rows: list[dict[int, int]] = [{} for _ in range(N)]
    accepted = 0
    for event in speculative(causal, batch, cfg, RunContext(), lambda generator: TopTwoTree(causal)):
        accepted += sum(event.accepted)
        for b, pairs in enumerate(event.tokens):
            rows[b].update(pairs)
    assert accepted > 0.1 * N
    first, second = first_two([[row[i] for i in sorted(row)] for row in rows])
    assert chi_square_p_value(first, marginals[0]) > 1e-3
    assert chi_square_p_value(second, marginals[1]) > 1e-3


def test_the_chi_square_check_has_power(causal, near_draft, prompt, marginals):
    """Drawing from the drafter's q instead of the target's p must fail the same test."""
    q1 = next_distribution(near_draft, torch.tensor([prompt]))[0]
    q1 = torch.where(marginals[0] > 0, q1 + 1e-3, torch.zeros_like(q1))  # same support, q's shape
    draws = torch.multinomial(q1, N, replacement=True, generator=torch.Generator().manual_seed(0)).tolist()
    assert chi_square_p_value(draws, marginals[0]) < 1e-3
