"""Acceptance rules on hand-built distributions: greedy prefix match, Leviathan/Chen rejection sampling."""

from __future__ import annotations

import pytest
import torch

from fastdecode.speculative.verify import target_distribution, verify_greedy, verify_sampling

V = 6


def logits_with_argmax(tokens: list[int]) -> torch.Tensor:
    """`[len, V]` logits whose row i has its maximum at tokens[i]."""
    out = torch.zeros(len(tokens), V)
    out[torch.arange(len(tokens)), torch.tensor(tokens)] = 5.0
    return out


def test_greedy_accepts_all_and_adds_the_bonus():
    v = verify_greedy(torch.tensor([3, 1, 4]), logits_with_argmax([3, 1, 4, 2]))
    assert v.accepted == 3 and v.tokens == [3, 1, 4, 2]


def test_greedy_stops_at_first_mismatch_and_emits_the_target_token():
    v = verify_greedy(torch.tensor([3, 1, 4]), logits_with_argmax([3, 5, 4, 2]))
    assert v.accepted == 1 and v.tokens == [3, 5]  # the later match at position 3 does not count


def test_greedy_empty_draft_is_one_plain_step():
    v = verify_greedy(torch.tensor([], dtype=torch.long), logits_with_argmax([2]))
    assert v.accepted == 0 and v.tokens == [2]


def test_greedy_ties_go_to_the_lowest_id_like_ar_greedy():
    logits = torch.zeros(2, V)
    logits[0, [2, 4]] = 1.0
    assert verify_greedy(torch.tensor([4]), logits).tokens == [2]


def probs(*rows: list[float]) -> torch.Tensor:
    t = torch.tensor(rows, dtype=torch.float32)
    return t / t.sum(-1, keepdim=True)


def test_one_hot_q_accepts_certain_tokens_and_never_impossible_ones():
    g = torch.Generator().manual_seed(0)
    p = probs([0, 0, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0])
    for _ in range(50):
        assert verify_sampling(torch.tensor([2]), None, p, g).tokens == [2, 1]
    p = probs([0, 0, 0, 1, 1, 0], [1, 1, 1, 1, 1, 1])
    for _ in range(50):
        v = verify_sampling(torch.tensor([2]), None, p, g)
        assert v.accepted == 0 and v.tokens[0] in (3, 4)


def test_one_hot_q_residual_is_p_without_the_draft_token():
    g = torch.Generator().manual_seed(1)
    p = probs([4, 3, 2, 1, 0, 0], [1, 1, 1, 1, 1, 1])
    n = 10000
    first = torch.tensor([verify_sampling(torch.tensor([0]), None, p, g).tokens[0] for _ in range(n)])
    counts = torch.bincount(first, minlength=V).float()
    # accepted with p(0) = 0.4; otherwise drawn from p without token 0: overall the marginal is p itself
    torch.testing.assert_close(counts / n, p[0], atol=0.02, rtol=0)
    rejected = counts.clone()
    rejected[0] = 0
    torch.testing.assert_close(rejected / rejected.sum(), probs([0, 3, 2, 1, 0, 0])[0], atol=0.02, rtol=0)


def test_rejection_rate_and_residual_match_the_formula():
    g = torch.Generator().manual_seed(2)
    p = probs([0.1, 0.5, 0.2, 0.2, 0, 0], [1, 1, 1, 1, 1, 1])
    q = probs([0.4, 0.2, 0.2, 0.1, 0.1, 0])
    n = 12000
    emitted, accepted = [], 0
    for _ in range(n):
        x = torch.multinomial(q[0], 1, generator=g)
        v = verify_sampling(x, q, p, g)
        accepted += v.accepted
        emitted.append(v.tokens[0])
        if v.accepted == 0:
            assert v.tokens[0] in (1, 3)  # where p > q: the support of max(p - q, 0)
    # P(accept) = sum_x min(p, q) = 0.1 + 0.2 + 0.2 + 0.1 = 0.6; the emitted token is distributed as p
    assert accepted / n == pytest.approx(0.6, abs=0.02)
    freq = torch.bincount(torch.tensor(emitted), minlength=V).float() / n
    torch.testing.assert_close(freq, p[0], atol=0.02, rtol=0)


def test_residual_after_rejection_is_normalised_max_p_minus_q():
    g = torch.Generator().manual_seed(3)
    p = probs([0.1, 0.5, 0.2, 0.2, 0, 0], [1, 1, 1, 1, 1, 1])
    q = probs([0.4, 0.2, 0.2, 0.1, 0.1, 0])
    x = torch.tensor([0])  # p/q = 1/4, rejected three times in four
    after = [verify_sampling(x, q, p, g) for _ in range(8000)]
    after = torch.tensor([v.tokens[0] for v in after if v.accepted == 0])
    freq = torch.bincount(after, minlength=V).float() / after.numel()
    torch.testing.assert_close(freq, probs([0, 0.3, 0, 0.1, 0, 0])[0], atol=0.02, rtol=0)


def test_bonus_token_is_drawn_from_the_last_target_row():
    g = torch.Generator().manual_seed(4)
    p = probs([0, 1, 0, 0, 0, 0], [0, 0, 0, 1, 1, 2])
    bonus = torch.tensor([verify_sampling(torch.tensor([1]), None, p, g).tokens[1] for _ in range(8000)])
    torch.testing.assert_close(torch.bincount(bonus, minlength=V).float() / 8000, p[1], atol=0.02, rtol=0)


def test_acceptance_stops_at_the_first_rejection():
    g = torch.Generator().manual_seed(5)
    p = probs([0, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1])
    v = verify_sampling(torch.tensor([1, 3, 2]), None, p, g)  # x_2 = 3 has p = 0
    assert v.accepted == 1 and v.tokens == [1, 0]


def test_equal_p_and_q_always_accept():
    g = torch.Generator().manual_seed(6)
    p = probs([1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1])
    for _ in range(200):
        x = torch.multinomial(p[0], 1, generator=g)
        assert verify_sampling(x, p[:1], p, g).accepted == 1


def test_seeded_verification_repeats():
    p = probs([1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1], [1, 1, 1, 1, 1, 1])
    q = probs([6, 5, 4, 3, 2, 1], [1, 2, 3, 4, 5, 6])
    x = torch.tensor([0, 5])
    a = [verify_sampling(x, q, p, torch.Generator().manual_seed(9)) for _ in range(3)]
    assert a[0] == a[1] == a[2]


def test_what_the_drafter_asked_comes_with_the_verdict_and_changes_no_draw():
    p = probs([1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1], [1, 1, 1, 1, 1, 1])
    q = probs([6, 5, 4, 3, 2, 1], [1, 2, 3, 4, 5, 6])
    asked = torch.tensor([[7, 8], [9, 10]])
    for x in (torch.tensor([0, 5]), torch.tensor([], dtype=torch.long)):
        bare = verify_sampling(x, q[: x.numel()], p, torch.Generator().manual_seed(3))
        both = verify_sampling(x, q[: x.numel()], p, torch.Generator().manual_seed(3), asked)
        assert (both.accepted, both.tokens) == (bare.accepted, bare.tokens) and bare.read is None
        assert torch.equal(both.read, asked)


def test_target_distribution_applies_processors():
    logits = torch.tensor([[4.0, 2.0, 1.0, 0.0]])
    assert torch.allclose(target_distribution(logits, 1.0), logits.softmax(-1))
    assert torch.allclose(target_distribution(logits, 2.0), (logits / 2).softmax(-1))
    top2 = target_distribution(logits, 1.0, top_k=2)
    assert top2[0, 2:].sum() == 0 and torch.allclose(top2[0, :2], logits[0, :2].softmax(-1))
    nucleus = target_distribution(logits, 1.0, top_p=0.5)
    assert nucleus[0, 0] == 1.0
