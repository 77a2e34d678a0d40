"""Speculative sampling reproduces the target's distribution: chi-square tests of the first and second
emitted tokens against exact marginals, for a model drafter (real q) and a deterministic drafter (q one-hot)."""

from __future__ import annotations

import pytest
import torch
from sampling_stats import PROCESSORS, N, chi_square_p_value, first_two, next_distribution, token_marginals

import fastdecode
from fastdecode.engine import encode_batch
from fastdecode.registry import RunContext
from fastdecode.speculative.drafter import BaseDrafter, Draft, SpecConfig
from fastdecode.speculative.drafters.draft_model import DraftModelConfig, ModelDrafter
from fastdecode.speculative.driver import speculative
from fastdecode.speculative.model_chain import ModelChainDrafter


@pytest.mark.parametrize("each", [True, False], ids=["read-each-token", "unread-as-on-a-gpu"])
def test_model_drafter_sampling_matches_the_target(causal, near_draft, prompt, marginals, each, monkeypatch):
    """Both drafting loops: the CPU's, which reads each draw, and a GPU's, which leaves the draws and q unread."""
    monkeypatch.setattr(ModelChainDrafter, "read_each_token", each)
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
        """`[B, L]` CPU context (what the driver passes) -> `[B, 2]` on the CPU (what a Draft holds)."""
        ids = ids.to(self.model.device)
        positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        return self.model.forward(ids, positions)[:, -1].topk(2).indices.cpu()


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



@pytest.mark.parametrize("adaptive", [False, True])
def test_a_confidence_stop_keeps_the_target_distribution(causal, near_draft, prompt, marginals, adaptive):
    """The stop ends a draft on the draft's own probabilities (adapted: and on the earlier verdicts), never on the
    target's, so the verification's draws stay the target's. The threshold sits below the draft's confidence in its
    first token (the same prompt for every row) and among its confidences in the second, so that a 3-token draft is
    cut after its second token on some rows and not on others: the third token comes from the draft or from the
    verification's bonus. Adapted, each row starts with five known drafted tokens, so that its first verdict moves its
    threshold before its second draft."""
    ids = torch.tensor([prompt], device=near_draft.device)
    first = near_draft.forward(ids, torch.arange(len(prompt), device=ids.device)[None])[0, -1].softmax(-1).max().item()
    cfg = DraftModelConfig(max_new_tokens=4, num_draft_tokens=3, confidence_stop=0.95 * first, adaptive_stop=adaptive,
                           seed=14, **PROCESSORS)
    batch = encode_batch(causal, [prompt] * N, cfg.max_new_tokens)
    drafters: list[ModelDrafter] = []

    def new_drafter(generator):
        drafter = ModelDrafter(near_draft, cfg, generator)
        if drafter.adaptive is not None:
            drafter.adaptive.scores, drafter.adaptive.hits = [0.9, 0.6, 0.4, 0.3, 0.2], [1, 1, 1, 0, 0]
        drafters.append(drafter)
        return drafter

    rows: list[dict[int, int]] = [{} for _ in range(N)]
    cut = 0
    for event in speculative(causal, batch, cfg, RunContext(), new_drafter):
        if event.index == 0:
            cut += sum(1 for p in event.proposed if p == 2)  # a 3-token draft ended by the stop after its second
        for b, pairs in enumerate(event.tokens):
            rows[b].update(pairs)
    assert 0.05 * N < cut < 0.95 * N
    if adaptive:
        assert sum(d.confidence_stop != cfg.confidence_stop for d in drafters) > 0.5 * N  # the thresholds moved
    outputs = [[row[i] for i in sorted(row)] for row in rows]
    first_tokens, second_tokens = first_two(outputs)
    assert chi_square_p_value(first_tokens, marginals[0]) > 1e-3
    assert chi_square_p_value(second_tokens, marginals[1]) > 1e-3
    third = [o[2] for o in outputs if len(o) > 2]
    assert len(third) > 0.9 * N
    assert chi_square_p_value(third, token_marginals(causal, prompt, 3)[2]) > 1e-3
