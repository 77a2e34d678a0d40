"""Sampled spec.rsd (siblings drawn without replacement, RSD verification) and spec.dyntree (a deterministic
tree, q one-hot) reproduce the target's distribution: chi-square tests of the first and second emitted tokens
against exact marginals, with a draft model close to the target so that acceptance and rejection both occur."""

from __future__ import annotations

import pytest
import torch

import fastdecode
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
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2))


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


@pytest.mark.parametrize("method,params", [
    ("spec.rsd", {"branches": "3,2"}),
    ("spec.dyntree", {"total_tokens": 20, "depth": 2, "width": 5}),
])
def test_tree_sampling_with_a_draft_model_matches_the_target(causal, near_draft, prompt, marginals, method, params):
    results = fastdecode.generate(causal, [prompt] * N, method, draft=near_draft, seed=21, max_new_tokens=3,
                                  **params, **PROCESSORS)
    accepted = [r.stats.accepted_per_position for r in results]
    first = sum(a[0] if a else 0 for a in accepted)
    assert 0.1 * N < first < 0.9 * N  # the root's siblings are accepted and rejected, often
    second = sum(a[1] if len(a) > 1 else 0 for a in accepted)
    assert second > 0.05 * N  # and depth 2 is reached
    outputs = [r.token_ids for r in results]
    assert chi_square_p_value([o[0] for o in outputs], marginals[0]) > 1e-3
    assert chi_square_p_value([o[1] for o in outputs if len(o) > 1], marginals[1]) > 1e-3
