"""Set-level quality of generated images, on the evaluator's features (NumPy, float64).

- `frechet_distance`: ||mu_a - mu_b||^2 + tr(S_a + S_b - 2 (S_a S_b)^(1/2)), FID's formula on our features. Biased
  upwards at small N, so compare methods only at equal N.
- `kid`: the unbiased MMD^2 with the cubic polynomial kernel k(x, y) = (x.y / d + 1)^3 (Binkowski et al. 2018),
  averaged over random subsets; unbiased, so two samples of one distribution give ~0 (either sign) at any N.
- `precision_recall`: the k-NN manifold estimate (Kynkaanniemi et al. 2019): precision is the share of generated
  points inside some real point's k-NN ball, recall the share of real points inside some generated point's ball.

The tensors are small (a few thousand 64-d points), so everything is exact and dense.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import FastDecodeError


class MetricsError(FastDecodeError, ValueError):
    """Feature sets the metrics cannot compare (empty, one point, mismatched widths)."""


def _check(a: np.ndarray, b: np.ndarray, least: int) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise MetricsError(f"Features must be two [N, D] arrays of one width D, not {a.shape} and {b.shape}.")
    if len(a) < least or len(b) < least:
        raise MetricsError(f"Each feature set needs at least {least} points, not {len(a)} and {len(b)}: "
                           "generate more samples.")
    return a, b


def _sqrt_psd(m: np.ndarray) -> np.ndarray:
    """The symmetric square root of a symmetric positive semi-definite matrix (eigenvalues clipped at 0)."""
    w, v = np.linalg.eigh((m + m.T) / 2)
    return (v * np.sqrt(np.clip(w, 0, None))) @ v.T


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Fréchet distance between Gaussians fitted to features a [N, D] and b [M, D].

    tr((S_a S_b)^(1/2)) = tr((S_a^(1/2) S_b S_a^(1/2))^(1/2)), whose argument is symmetric PSD: an eigh, no sqrtm.
    """
    a, b = _check(a, b, 2)
    mu = a.mean(0) - b.mean(0)  # [D]
    sa, sb = np.cov(a, rowvar=False), np.cov(b, rowvar=False)  # [D, D]
    root = _sqrt_psd(sa)
    cross = np.trace(_sqrt_psd(root @ sb @ root))
    return float(max(mu @ mu + np.trace(sa) + np.trace(sb) - 2 * cross, 0.0))


def _poly(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return (x @ y.T / x.shape[1] + 1.0) ** 3  # [n, m]


def mmd2_unbiased(x: np.ndarray, y: np.ndarray) -> float:
    """Unbiased MMD^2 with the cubic polynomial kernel: diagonal terms left out of the within-set means."""
    n, m = len(x), len(y)
    kxx, kyy, kxy = _poly(x, x), _poly(y, y), _poly(x, y)
    within_x = (kxx.sum() - np.trace(kxx)) / (n * (n - 1))
    within_y = (kyy.sum() - np.trace(kyy)) / (m * (m - 1))
    return float(within_x + within_y - 2 * kxy.mean())


@dataclass(frozen=True)
class KID:
    mean: float
    std: float  # over the subsets
    subsets: int
    subset_size: int


def kid(a: np.ndarray, b: np.ndarray, subsets: int = 20, subset_size: int = 500, seed: int = 0) -> KID:
    """Kernel Inception Distance on our features: mean and spread of the unbiased MMD^2 over random subsets of
    min(subset_size, |a|, |b|) points each (a whole set when it is that small, then one subset suffices)."""
    a, b = _check(a, b, 2)
    size = min(subset_size, len(a), len(b))
    rng = np.random.default_rng(seed)
    whole = size == len(a) == len(b)
    values = []
    for _ in range(1 if whole else subsets):
        ia = rng.choice(len(a), size, replace=False)
        ib = rng.choice(len(b), size, replace=False)
        values.append(mmd2_unbiased(a[ia], b[ib]))
    return KID(float(np.mean(values)), float(np.std(values)), len(values), size)


def _knn_radii(x: np.ndarray, k: int) -> np.ndarray:
    """Distance from each point of x to its k-th nearest other point of x."""
    d = _distances(x, x)  # [n, n]
    np.fill_diagonal(d, np.inf)
    return np.sort(d, axis=1)[:, k - 1]


def _distances(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    sq = (x * x).sum(1)[:, None] + (y * y).sum(1)[None, :] - 2 * x @ y.T  # [n, m]
    return np.sqrt(np.clip(sq, 0, None))


def _coverage(points: np.ndarray, centres: np.ndarray, radii: np.ndarray) -> float:
    """Share of `points` inside at least one ball (centre, radius)."""
    return float((_distances(points, centres) <= radii[None, :]).any(1).mean())


@dataclass(frozen=True)
class PrecisionRecall:
    precision: float
    recall: float


def precision_recall(real: np.ndarray, fake: np.ndarray, k: int = 3) -> PrecisionRecall:
    """k-NN precision (fidelity: fake inside the real manifold) and recall (diversity: real inside the fake one)."""
    real, fake = _check(real, fake, k + 1)
    return PrecisionRecall(precision=_coverage(fake, real, _knn_radii(real, k)),
                           recall=_coverage(real, fake, _knn_radii(fake, k)))


def gap_fraction(fd_method: float, fd_teacher: float, fd_independent: float) -> float | None:
    """(FD_m - FD_AR) / (FD_indep - FD_AR): 0 at the teacher's quality, 1 at the independent baseline's."""
    span = fd_independent - fd_teacher
    return (fd_method - fd_teacher) / span if span > 0 else None
