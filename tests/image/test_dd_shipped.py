"""The shipped Distilled Decoding networks keep their cards' claims, measured again on the cards' first rows."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
import torch

from fastdecode.image.dd import dd_sample, noise, teacher_map
from fastdecode.image.dd_methods import dd_network
from fastdecode.train.dd2 import nll_per_token

ROWS = 16  # of the card's eval rows: the first ones, drawn from the same seed


def _card(name: str) -> dict:
    folder = Path(str(resources.files("fastdecode") / "zoo" / "img-ar" / "heads" / name))
    if not (folder / "card.json").is_file():
        pytest.skip(f"zoo:img-ar/{name} is not trained here (fastdecode train {name})")
    return json.loads((folder / "card.json").read_text())


def test_dd1_card_agreement(img_ar) -> None:
    card = _card("dd1")
    model = img_ar.with_scale(img_ar.image.cfg_scale)
    net = dd_network(model, "dd1", "")
    image = model.image
    gen = torch.Generator().manual_seed(card["seed"] + 99_991)
    rows = card["training"]["eval_rows"]
    labels = (image.K + torch.randint(image.C, (rows,), generator=gen))[:ROWS]
    eps = noise(rows, image.tokens, image.d, gen)[:ROWS]
    codes = teacher_map(model, labels, eps, card["training"]["map_steps"])
    for steps in (1, 2):
        got = float((dd_sample(net, labels, eps, steps) == codes).float().mean())
        assert abs(got - card["held_out_agreement"][f"{steps}-step"]) < 0.08, (steps, got)


def test_dd2_card_nll(img_ar) -> None:
    card = _card("dd2")
    model = img_ar.with_scale(img_ar.image.cfg_scale)
    net = dd_network(model, "dd2", "")
    image = model.image
    gen = torch.Generator().manual_seed(card["seed"] + 10_000)
    rows = card["training"]["eval_rows"]
    labels = (image.K + torch.randint(image.C, (rows,), generator=gen))
    codes = dd_sample(net, labels, noise(rows, image.tokens, image.d, gen), 1)
    got = nll_per_token(model, labels[:64], codes[:64])
    assert abs(got - card["teacher_nll_per_token"]) < 0.1 * card["teacher_nll_per_token"], got
