"""Pure functions of dlm decoding on hand-built tensors: schedule, predictions, confidence, top-k, stop rule."""

from __future__ import annotations

import math

import torch

from fastdecode.diffusion.driver import finished
from fastdecode.diffusion.rules import select_topk
from fastdecode.diffusion.scores import confidence, num_transfer_tokens, predict

NEG = float("-inf")


def test_transfer_schedule_splits_evenly_remainder_first():
    k = num_transfer_tokens(torch.tensor([10, 8, 3, 0]), 4)
    assert k.tolist() == [[3, 3, 2, 2], [2, 2, 2, 2], [1, 1, 1, 0], [0, 0, 0, 0]]
    for masks in range(0, 40):
        for steps in range(1, 12):
            row = num_transfer_tokens(torch.tensor([masks]), steps)[0]
            assert int(row.sum()) == masks and int(row.max() - row.min()) <= (masks % steps != 0)
            assert row.tolist() == sorted(row.tolist(), reverse=True)


def test_confidence_is_the_float64_probability_of_x0():
    logits = torch.tensor([[[0.0, math.log(2.0), 0.0], [math.log(3.0), 0.0, 0.0]]])  # [1, 2, 3]
    x0 = predict(logits, 0.0, None)
    p = confidence(logits, x0)
    assert x0.tolist() == [[1, 0]] and p.dtype == torch.float64
    assert torch.allclose(p, torch.tensor([[0.5, 0.6]], dtype=torch.float64))
    at_sample = confidence(logits, torch.tensor([[0, 2]]))  # p at a sampled x0, not the max
    assert torch.allclose(at_sample, torch.tensor([[0.25, 0.2]], dtype=torch.float64))


def test_ties_go_to_the_lowest_id_and_the_lowest_position():
    logits = torch.zeros(1, 3, 4)  # every token and every position tied
    assert predict(logits, 0.0, None).tolist() == [[0, 0, 0]]
    assert confidence(logits, predict(logits, 0.0, None)).tolist() == [[0.25] * 3]
    score = torch.tensor([[0.5, 0.7, 0.5, 0.5, 0.7]], dtype=torch.float64)
    assert select_topk(score, torch.tensor([3])).tolist() == [[True, True, False, False, True]]


def test_select_topk_takes_k_per_row_and_never_a_minus_inf_position():
    score = torch.tensor([[0.1, NEG, 0.9, 0.4], [NEG, NEG, 0.2, NEG]], dtype=torch.float64)
    chosen = select_topk(score, torch.tensor([2, 3]))
    assert chosen.tolist() == [[False, False, True, True], [False, False, True, False]]


def test_gumbel_max_samples_softmax_and_repeats_with_a_seed():
    probs = torch.tensor([0.2, 0.5, 0.3])
    logits = probs.log().expand(4000, 3)
    draws = predict(logits, 1.0, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=3).double() / 4000
    assert torch.allclose(freq, probs.double(), atol=0.03)
    assert torch.equal(draws, predict(logits, 1.0, torch.Generator().manual_seed(0)))
    assert predict(logits * 50, 0.01, torch.Generator().manual_seed(1)).eq(1).all()  # T -> 0 is argmax


def test_a_row_finishes_once_settled_through_its_first_eos():
    M, E = 9, 1  # mask and EOS ids
    gen = torch.tensor([
        [5, E, M, M],  # settled through the EOS: done
        [M, 5, E, 6],  # a mask before the EOS: running
        [5, 6, 7, 8],  # fully decoded, no EOS: done
        [5, M, 7, 8],  # no EOS, a mask left: running
        [E, M, E, M],  # the first EOS counts
    ])
    assert finished(gen, M, torch.tensor([E])).tolist() == [True, False, True, False, True]
    assert finished(gen, M, torch.tensor([], dtype=torch.long)).tolist() == [False, False, True, False, False]


def test_margin_entropy_and_logit_gap_on_hand_built_logits():
    from fastdecode.diffusion.scores import logit_gap, margin, neg_entropy

    logits = torch.tensor([[math.log(6.0), math.log(3.0), 0.0], [1.0, 1.0, 0.0], [5.0, NEG, NEG]])  # p = .6 .3 .1
    assert torch.allclose(margin(logits), torch.tensor([0.3, 0.0, 1.0], dtype=torch.float64))  # a tie has margin 0
    h = -(0.6 * math.log(0.6) + 0.3 * math.log(0.3) + 0.1 * math.log(0.1))
    ent = neg_entropy(logits)
    assert ent.dtype == torch.float64 and ent[2] == 0.0  # one-hot (other logits -inf): no nan, zero entropy
    assert torch.allclose(ent[0], torch.tensor(-h, dtype=torch.float64))
    assert torch.allclose(logit_gap(logits), torch.tensor([math.log(2.0), 0.0, math.inf], dtype=torch.float64))


def test_scores_rank_a_certain_position_above_an_uncertain_one():
    from fastdecode.diffusion.scores import logit_gap, margin, neg_entropy

    logits = torch.tensor([[4.0, 0.0, 0.0, 0.0], [1.0, 0.9, 0.8, 0.0]])
    for score in (confidence(logits, logits.argmax(-1)), margin(logits), neg_entropy(logits), logit_gap(logits)):
        assert score[0] > score[1]


def test_random_score_is_uniform_float64_and_seeded():
    from fastdecode.diffusion.scores import random_score

    a = random_score(torch.Size([2, 500]), torch.Generator().manual_seed(3), torch.device("cpu"))
    b = random_score(torch.Size([2, 500]), torch.Generator().manual_seed(3), torch.device("cpu"))
    assert a.dtype == torch.float64 and torch.equal(a, b) and 0 <= a.min() and a.max() < 1
    assert abs(float(a.mean()) - 0.5) < 0.05
