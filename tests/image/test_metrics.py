"""The image benchmark's set metrics on synthetic features, where the answer is known in closed form."""

from __future__ import annotations

import numpy as np
import pytest

from fastdecode.image.metrics import (
    MetricsError,
    frechet_distance,
    gap_fraction,
    kid,
    mmd2_unbiased,
    precision_recall,
)


def test_frechet_distance_of_a_set_with_itself_is_zero():
    x = np.random.default_rng(0).normal(size=(500, 8))
    assert frechet_distance(x, x) == pytest.approx(0.0, abs=1e-8)


def test_frechet_distance_of_shifted_gaussians_matches_the_closed_form():
    """N(0, I) against N(m, s^2 I) in d dims: |m|^2 + d (1 - s)^2, from the sample moments at large N."""
    rng = np.random.default_rng(1)
    d, s = 4, 2.0
    mean = np.array([1.0, -0.5, 0.0, 2.0])
    a = rng.normal(size=(40_000, d))
    b = mean + s * rng.normal(size=(40_000, d))
    expected = mean @ mean + d * (1 - s) ** 2
    assert frechet_distance(a, b) == pytest.approx(expected, rel=0.03)


def test_frechet_distance_with_correlated_covariances_matches_an_exact_formula():
    """Covariances that commute (both diagonal in one rotated basis): tr(sqrt(S_a S_b)) = sum sqrt(l_a l_b)."""
    rng = np.random.default_rng(2)
    q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    la, lb = np.array([1.0, 4.0, 0.25]), np.array([9.0, 1.0, 1.0])
    a = rng.normal(size=(60_000, 3)) * np.sqrt(la) @ q.T
    b = rng.normal(size=(60_000, 3)) * np.sqrt(lb) @ q.T
    expected = np.sum(la + lb - 2 * np.sqrt(la * lb))
    assert frechet_distance(a, b) == pytest.approx(expected, rel=0.03)


def test_kid_is_near_zero_for_one_distribution_and_positive_for_two():
    rng = np.random.default_rng(3)
    same = [kid(rng.normal(size=(300, 16)), rng.normal(size=(300, 16)), seed=i).mean for i in range(10)]
    # unbiased: the values scatter around 0 (some negative), far below a real difference
    assert abs(np.mean(same)) < 0.01
    assert min(same) < 0
    shifted = kid(rng.normal(size=(300, 16)), 0.5 + rng.normal(size=(300, 16))).mean
    assert shifted > 10 * max(abs(v) for v in same)


def test_unbiased_mmd_leaves_the_diagonal_out():
    """Two one-point-apart sets of two points each: MMD^2 by hand with the cubic kernel (x.y/d + 1)^3."""
    x = np.array([[1.0, 0.0], [0.0, 1.0]])
    y = np.array([[1.0, 1.0], [0.0, 0.0]])
    k = lambda u, v: (u @ v / 2 + 1) ** 3  # noqa: E731
    xx = k(x[0], x[1])
    yy = k(y[0], y[1])
    xy = np.mean([k(a, b) for a in x for b in y])
    assert mmd2_unbiased(x, y) == pytest.approx(xx + yy - 2 * xy)


def test_precision_and_recall_on_toy_sets():
    """Fakes that collapse onto one part of the real set: precision stays 1, recall falls to about that part."""
    rng = np.random.default_rng(4)
    real = rng.uniform(0, 1, size=(400, 2))
    collapsed = rng.uniform(0, 0.5, size=(400, 2))  # a quarter of the real square
    pr = precision_recall(real, collapsed)
    assert pr.precision > 0.9
    assert 0.15 < pr.recall < 0.45
    same = precision_recall(real, rng.uniform(0, 1, size=(400, 2)))
    assert same.precision > 0.9 and same.recall > 0.9
    far = precision_recall(real, 5 + rng.uniform(0, 1, size=(400, 2)))
    assert far.precision == 0.0 and far.recall == 0.0


def test_gap_fraction_places_a_method_between_teacher_and_independent():
    assert gap_fraction(10.0, 5.0, 25.0) == pytest.approx(0.25)
    assert gap_fraction(5.0, 5.0, 25.0) == 0.0
    assert gap_fraction(5.0, 5.0, 5.0) is None


def test_bad_feature_sets_are_refused_with_a_fix():
    with pytest.raises(MetricsError, match="one width"):
        frechet_distance(np.zeros((5, 3)), np.zeros((5, 4)))
    with pytest.raises(MetricsError, match="generate more samples"):
        precision_recall(np.zeros((3, 2)), np.zeros((10, 2)))
