"""Fixtures of the statistical tests: a draft close to the target, a prompt and its exact token marginals."""

from __future__ import annotations

import pytest
import torch
from sampling_stats import next_distribution

import fastdecode


@pytest.fixture(scope="module")
def near_draft(causal_dir):
    """The target with a perturbed output head: q overlaps p by about half, so both paths are common."""
    draft = fastdecode.load(causal_dir)
    head = draft.model.lm_head.weight
    with torch.no_grad():
        head.add_(0.1 * torch.randn(head.shape, generator=torch.Generator().manual_seed(0)).to(head.device))
    return draft


@pytest.fixture(scope="module")
def prompt(causal):
    return causal.encode("the quick brown fox")


@pytest.fixture(scope="module")
def marginals(causal, prompt):
    """Exact distributions of the first generated token, and of the second given that the first is not EOS."""
    p1 = next_distribution(causal, torch.tensor([prompt]))[0]  # [V]
    support = [x for x in p1.nonzero().squeeze(-1).tolist() if x not in causal.eos_token_ids]
    ids = torch.cat([torch.tensor([prompt]).expand(len(support), -1), torch.tensor(support)[:, None]], 1)
    weights = p1[support] / p1[support].sum()
    p2 = (weights[:, None] * next_distribution(causal, ids)).sum(0)  # [V] = sum_x p1(x | not EOS) p(. | x)
    return p1, p2
