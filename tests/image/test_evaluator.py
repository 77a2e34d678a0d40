"""The image benchmark's evaluator: its shape, its bfloat16 round trip, and the card's test accuracy."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch

from fastdecode.image.evaluator import (
    DigitCNN,
    EvaluatorError,
    default_folder,
    load_evaluator,
    save_evaluator,
    to_input,
)


def test_the_network_is_small_and_its_features_are_64_wide():
    net = DigitCNN()
    assert 50_000 <= sum(p.numel() for p in net.parameters()) <= 100_000
    x = to_input(np.zeros((3, 8, 8), dtype=np.uint8))  # any size is resized to 28x28
    assert x.shape == (3, 1, 28, 28)
    assert net.features(x).shape == (3, 64)


def test_saved_weights_are_bfloat16_and_load_back(tmp_path):
    torch.manual_seed(0)
    net = DigitCNN()
    save_evaluator(net, tmp_path)
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(str(tmp_path / "model.safetensors")).values()} == {torch.bfloat16}
    images = np.random.default_rng(0).integers(0, 256, size=(5, 28, 28)).astype(np.uint8)
    loaded = load_evaluator(tmp_path).score(images).features
    with torch.no_grad():
        exact = net.float().features(to_input(images)).double().numpy()
    assert np.allclose(loaded, exact, atol=0.05 * np.abs(exact).max())  # bfloat16 rounding only


def test_a_missing_evaluator_says_how_to_make_it(tmp_path):
    with pytest.raises(EvaluatorError, match="fastdecode train img-eval"):
        load_evaluator(tmp_path)


@pytest.mark.skipif(importlib.util.find_spec("mlxtend") is None, reason="needs the image extra (mlxtend)")
@pytest.mark.skipif(not (default_folder() / "model.safetensors").is_file(), reason="img-eval is not trained here")
def test_the_card_accuracy_holds_on_300_test_images():
    from fastdecode.image.data import mnist5k

    card = json.loads((default_folder() / "card.json").read_text())
    images, labels = mnist5k("test")
    pick = np.random.default_rng(0).permutation(len(images))[:300]
    accuracy = load_evaluator().accuracy(images[pick], labels[pick])
    # the card's figure is over all 1,000 test images; 300 of them scatter by about 1 point
    assert accuracy == pytest.approx(card["test_accuracy"], abs=0.03)
    assert card["test_accuracy"] >= 0.95
