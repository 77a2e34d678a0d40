"""Commit rules on hand-built scores: thresholds and their ties, the forced top-1, rankings, budgets."""

from __future__ import annotations

import math

import pytest
import torch

from fastdecode.diffusion import rules

NEG = float("-inf")


def t(rows, dtype=torch.float64):
    return torch.tensor(rows, dtype=dtype)


def chosen(mask: torch.Tensor) -> list[list[int]]:
    return [row.nonzero().squeeze(-1).tolist() for row in mask]


def test_threshold_keeps_ties_at_tau_forces_the_top1_and_skips_rows_without_candidates():
    score = t([[0.95, 0.9, 0.89, NEG], [0.5, 0.3, NEG, 0.5], [NEG] * 4])
    assert chosen(rules.threshold(score, 0.9)) == [[0, 1], [0], []]  # row 1: nothing passes, the first best goes


def test_top1_takes_the_lowest_position_on_ties():
    assert chosen(rules.top1(t([[0.2, 0.7, 0.7], [NEG, NEG, NEG]]))) == [[1], []]


def test_factor_strict_commits_the_largest_n_with_n_plus_1_times_error_below_f():
    score = t([[0.7, 0.99, 0.5, 0.8], [0.4, 0.3, NEG, NEG], [0.999, 0.999, 0.999, NEG]])
    # row 0 sorted .99 .8 .7 .5: (n+1)(1-c) = .02, .6, 1.2 -> n = 2; row 1: 2 * .6 = 1.2 fails -> at least 1
    assert chosen(rules.factor(score, 1.0, "strict")) == [[1, 3], [0], [0, 1, 2]]
    assert chosen(rules.factor(score, 1.3, "strict")) == [[0, 1, 3], [0], [0, 1, 2]]  # 1.2 < 1.3 lets the third in


def test_factor_fast_dllm_commits_the_last_candidate_its_scan_reaches_and_passes_on_equality():
    score = t([
        [0.7, 0.99, 0.5, 0.8, NEG],  # .99 .8 | .7 < 1 - 1/4: the scan stops before the last -> 2
        [0.4, 0.3, NEG, NEG, NEG],  # two masks: the scan reaches the last, so both go (strict: 1)
        [0.99, 0.9, 0.5, NEG, NEG],  # .9 passes, .5 is the last and fails: committed anyway (strict: 2)
        [0.99, 0.9, 0.75, 0.1, 0.05],  # .75 = 1 - 1/4 passes on >= (strict: (3 + 1) * .25 = 1 is not < 1)
        [0.2, NEG, NEG, NEG, NEG],  # one mask: it goes
    ])
    assert chosen(rules.factor(score, 1.0)) == [[1, 3], [0, 1], [0, 1, 2], [0, 1, 2], [0]]
    assert chosen(rules.factor(score, 1.0, "strict")) == [[1, 3], [0], [0, 1], [0, 1], [0]]


def fast_dllm_factor_count(conf: list[float], factor: float) -> int:
    """How many tokens Fast-dLLM's `get_transfer_index_dynamic` commits for one row of masked confidences,
    re-written from the reference's loop: thresholds 1 - f/(n+1) with the first at -1, a scan that breaks at the
    first failure, and one more when the scan stopped at (or ran through to) the last candidate."""
    c = sorted(conf, reverse=True)
    thresholds = [-1.0] + [1 - factor / (n + 1) for n in range(2, len(c) + 1)]
    i = 0
    for i in range(len(thresholds)):
        if c[i] < thresholds[i]:
            break
    if i == 0 or i == len(thresholds) - 1:
        i += 1
    return i


@pytest.mark.parametrize("factor", [0.5, 1.0, 2.0])
def test_factor_fast_dllm_matches_the_reference_loop_on_random_rows(factor):
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        L = int(torch.randint(1, 9, (1,), generator=g))
        conf = (1 - torch.rand(L, generator=g, dtype=torch.float64) ** 3 * 0.6).tolist()
        row = t([conf + [NEG] * (8 - L)])
        assert int(rules.factor(row, factor).sum()) == fast_dllm_factor_count(conf, factor), conf


def test_entropy_bound_counts_the_entropy_ranked_before_each_position():
    h = t([[0.05, 0.3, 0.1, 0.02], [2.0, 3.0, NEG, NEG]])
    score = torch.where(torch.isfinite(h), -h, NEG)
    # row 0 ascending .02 .05 .1 .3: entropy before each = 0, .02, .07, .17 -> three within 0.15
    assert chosen(rules.entropy_bound(score, 0.15)) == [[0, 2, 3], [0]]
    assert chosen(rules.entropy_bound(score, 0.0)) == [[3], [0]]  # the lowest always goes


def test_local_leap_relaxes_the_threshold_only_near_an_anchor():
    score = t([[0.95, 0.8, 0.8, 0.8, 0.7, 0.8], [0.8, 0.85, NEG, NEG, NEG, NEG]])
    got = rules.local_leap(score, tau=0.9, radius=2, tau_relaxed=0.75)
    assert chosen(got) == [[0, 1, 2], [1]]  # position 3 is 3 away (relaxed picks do not become anchors)
    assert chosen(rules.local_leap(score, 0.9, 0, 0.75)) == [[0], [1]]


def test_select_topk_with_k_zero_selects_nothing():
    assert chosen(rules.select_topk(t([[0.3, 0.2]]), torch.tensor([0]))) == [[]]


def test_credit_decays_accumulates_the_boosted_top1_and_fuses_into_logits():
    logits = torch.tensor([[[math.log(2.0), 0.0, 0.0], [0.0, math.log(2.0), 0.0]]])  # p_top1 = 0.5 at both
    masked = torch.tensor([[True, False]])
    c1 = rules.credit_update(torch.zeros(1, 2, 3), logits, masked, beta=0.8, gamma=0.2)
    boost = 0.5 ** 0.2
    assert torch.allclose(c1, torch.tensor([[[boost, 0.0, 0.0], [0.0, 0.0, 0.0]]]))  # unmasked: no credit
    c2 = rules.credit_update(c1, logits, masked, beta=0.8, gamma=0.2)
    assert torch.allclose(c2[0, 0, 0], torch.tensor(1.8 * boost))
    fused = rules.credit_fuse(logits, c2, alpha=0.7)
    assert torch.allclose(fused - logits, 0.7 * torch.log1p(c2))


@pytest.mark.parametrize(
    "progress, level", [(0.0, 7.5), (0.32, 7.5), (0.33, 5.0), (0.66, 5.0), (0.67, 2.5), (1.0, 2.5)]
)
def test_prophet_threshold_falls_with_progress(progress, level):
    assert rules.prophet_threshold(torch.tensor([progress]))[0] == level


def test_prophet_exit_averages_the_gap_over_the_masks():
    gap, masked = t([[8.0, 7.0, 100.0], [8.0, 6.9, math.inf], [1.0, 1.0, 1.0]]), torch.tensor(
        [[True, True, False], [True, True, False], [False, False, False]])
    assert rules.prophet_exit(gap, masked, torch.tensor([0.1] * 3)).tolist() == [True, False, False]
    assert rules.prophet_exit(gap, masked, torch.tensor([0.5] * 3)).tolist() == [True, True, False]


def test_window_average_commits_whole_confident_windows_with_few_decoded_tokens():
    masked = torch.tensor([[True, True, True, False, True, True, False, False]])
    conf = t([[0.9, 0.7, 0.85, NEG, 0.9, 0.9, NEG, NEG]])
    inview = torch.ones_like(masked)
    assert chosen(rules.window_average(masked, conf, inview)) == [[0, 1, 2, 4, 5]]
    inview[0, 5:] = False  # windows must lie inside the view
    assert chosen(rules.window_average(masked, conf, inview)) == [[0, 1, 2, 4]]


def test_cluster_one_commits_one_position_per_confident_run_of_equal_predictions():
    masked = torch.tensor([[True, True, True, False, True, True, True]])
    x0 = torch.tensor([[5, 5, 6, 5, 7, 7, 7]])
    conf = t([[0.7, 0.85, 0.9, NEG, 0.81, 0.95, 0.95]])
    assert chosen(rules.cluster_one(masked, x0, conf, 0.8)) == [[1, 5]]  # a run of one (6) is no cluster
    assert chosen(rules.cluster_one(masked, x0, conf, 0.95)) == [[]]


def test_streaks_extend_restart_and_clear():
    token, count = rules.streaks(torch.tensor([[-1, 5, 5]]), torch.tensor([[0, 2, 1]]), torch.tensor([[4, 5, 6]]),
                                 torch.tensor([[True, True, False]]))
    assert token.tolist() == [[4, 5, -1]] and count.tolist() == [[1, 3, 0]]


def test_consistent_needs_the_same_prediction_in_the_remembered_top_sets():
    score, x0 = t([[0.9, 0.8, 0.7, NEG]]), torch.tensor([[1, 2, 3, 4]])
    top, ok = rules.consistent(score, x0, [torch.tensor([[1, 9, 3, -1]])], v=3)
    assert chosen(top) == [[0, 1, 2]] and chosen(ok) == [[0, 2]]
    assert chosen(rules.consistent(score, x0, [], v=3)[1]) == [[]]
