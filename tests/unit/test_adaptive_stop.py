"""The adaptive confidence stop: transformers' rule (its ROC threshold, its bookkeeping of the drafts' fate)."""

from __future__ import annotations

import random

import pytest

from fastdecode.speculative.adaptive_stop import AdaptiveStop, best_threshold


def test_the_threshold_minimises_false_positives_plus_three_false_negatives():
    # accepted drafts were confident, rejected ones not, but for 0.5: below 0.6 a stop loses no accepted token
    scores = [0.9, 0.8, 0.7, 0.6, 0.5, 0.3, 0.2]
    hits = [1, 1, 1, 1, 0, 0, 0]
    assert best_threshold(scores, hits) == 0.6
    # a false negative costs three false positives: an accepted token below two rejected ones keeps them drafting,
    # one accepted below four rejected ones does not (among 3 confident accepted tokens)
    assert best_threshold([0.9, 0.5, 0.4, 0.1], [1, 0, 0, 1]) == 0.1
    assert best_threshold([0.9, 0.8, 0.7, 0.5, 0.4, 0.3, 0.2, 0.1], [1, 1, 1, 0, 0, 0, 0, 1]) == 0.7
    # stopping after every token (+inf) costs 3, never the least: at the lowest score the cost is at most 1
    assert best_threshold([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == 0.1


def test_the_threshold_is_scikit_learns_on_random_drafts_with_ties():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = random.Random(0)
    for case in range(300):
        n = rng.randint(2, 40)
        grid = rng.choice([4, 10, 1000])  # few distinct values: many ties, and collinear ROC points
        scores = [rng.randint(0, grid) / grid for _ in range(n)]
        hits = [int(rng.random() < 0.6) for _ in range(n)]
        if len(set(hits)) < 2:
            continue
        fpr, tpr, thresholds = metrics.roc_curve(hits, scores)
        expected = thresholds[int((fpr + 3 * (1 - tpr)).argmin())]
        assert best_threshold(scores, hits) == expected, case


def test_a_drafts_tokens_after_its_first_rejection_are_dropped():
    stop = AdaptiveStop(0.4)
    assert stop.update([0.9, 0.8, 0.3, 0.7], accepted=2) == 0.4  # 3 known: too few to adapt
    assert (stop.scores, stop.hits) == ([0.9, 0.8, 0.3], [1, 1, 0])
    assert stop.update([0.95, 0.85], accepted=2) == 0.4  # all accepted: no rejection recorded; 5 known
    assert stop.update([], accepted=0) == 0.4  # no draft: nothing learnt
    assert stop.update([0.6, 0.2], accepted=0) == 0.8  # 6 known, both kinds: the lowest accepted confidence
    assert (stop.scores, stop.hits) == ([0.9, 0.8, 0.3, 0.95, 0.85, 0.6], [1, 1, 0, 1, 1, 0])


def test_no_adaptation_until_both_fates_are_seen():
    stop = AdaptiveStop(0.4)
    for _ in range(4):
        assert stop.update([0.9, 0.8], accepted=2) == 0.4
    assert len(stop.scores) == 8 and set(stop.hits) == {1}
