"""Logits processors and samplers on hand-built logits."""

from __future__ import annotations

import math

import torch

from fastdecode import sampling

NEG = float("-inf")


def probs(logits):
    return logits.softmax(-1)


def test_top_k_keeps_k_largest_and_ties():
    x = torch.tensor([[1.0, 3.0, 2.0, 3.0, 0.0]])
    assert sampling.top_k(x, 2).tolist() == [[NEG, 3.0, NEG, 3.0, NEG]]
    assert sampling.top_k(x, 3).tolist() == [[NEG, 3.0, 2.0, 3.0, NEG]]
    assert torch.equal(sampling.top_k(x, 0), x)


def test_top_p_exact_distribution():
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    x = p.log()
    kept = probs(sampling.top_p(x, 0.8))  # 0.5 + 0.3 reaches 0.8 exactly: two tokens
    torch.testing.assert_close(kept, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    kept = probs(sampling.top_p(x, 0.81))
    torch.testing.assert_close(kept, torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)
    assert sampling.top_p(x, 0.01).isfinite().sum() == 1  # the top token always stays


def test_min_p():
    p = torch.tensor([[0.6, 0.25, 0.1, 0.05]])
    kept = sampling.min_p(p.log(), 0.2)  # threshold 0.12
    assert kept.isfinite().tolist() == [[True, True, False, False]]


def test_temperature_and_repetition_penalty():
    x = torch.tensor([[2.0, -2.0, 1.0]])
    assert sampling.temperature(x, 2.0).tolist() == [[1.0, -1.0, 0.5]]
    seen = torch.tensor([[True, True, False]])
    assert sampling.repetition_penalty(x, seen, 2.0).tolist() == [[1.0, -4.0, 1.0]]


def test_sampler_is_seeded_and_follows_distribution():
    x = torch.tensor([[0.0, math.log(3.0)]]).expand(20000, 2)
    a = sampling.sample(x, torch.Generator().manual_seed(0))
    b = sampling.sample(x, torch.Generator().manual_seed(0))
    assert torch.equal(a, b)
    share = a.float().mean().item()
    assert abs(share - 0.75) < 0.015  # 4.9 standard deviations of a binomial(20000, 0.75) share


def test_greedy_ties_go_to_lowest_id():
    assert sampling.greedy(torch.tensor([[1.0, 5.0, 5.0]])).tolist() == [1]
