"""Fixtures of the statistical tests: a draft close to the target, a prompt and its exact token marginals."""

from __future__ import annotations

import pytest
import torch
from sampling_stats import token_marginals

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
    return tuple(token_marginals(causal, prompt, 2))
