"""Every head shipped beside a zoo model keeps its card's claim: τ of the method that decodes with it, measured again
on a few of the card's own held-out items, is within 10 % of what the card states for those items (the card keeps
per-item counts in card.json; README.md quotes the overall τ)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
import torch

import fastdecode
from fastdecode.train.measure import measure_tau, suite_prompts

ZOO = Path(str(resources.files("fastdecode") / "zoo"))
# drafter heads; the Learn2PD filter and the DuoAttention gates (decoding numbers, not τ) are checked by
# tests/unit/test_learn2pd.py and tests/sparse/test_duo.py
CARDS = sorted(p.parent for p in ZOO.glob("*/heads/*/card.json") if p.parent.name not in ("learn2pd", "duo"))
FEW = 4  # items re-measured per head: the first item of the first FEW tasks


def test_medusa_and_hydra_heads_ship_for_ar_small():
    assert {"medusa", "hydra"} <= {p.name for p in CARDS if p.parent.parent.name == "ar-small"}


@pytest.fixture(scope="module")
def targets():
    torch.set_num_threads(1)
    return {}


@pytest.mark.parametrize("folder", CARDS, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_the_card_claim_holds_on_a_few_items(folder, targets):
    card = json.loads((folder / "card.json").read_text())
    measured = card.get("measured")
    if not measured:
        pytest.skip(f"{folder.name}'s card measures no method")
    name = card["target"]
    model = targets.setdefault(name, fastdecode.load(name, device="cpu", dtype="float32"))
    per_task = measured["per_task"]
    picked = list(range(0, measured["items"], per_task))[:FEW]
    prompts = suite_prompts(measured["suite"], per_task)
    got = measure_tau(model, measured["method"], {**measured["params"], "head": str(folder)},
                      [prompts[i] for i in picked])
    claimed = sum(measured["item_tokens"][i] for i in picked) / sum(measured["item_forwards"][i] for i in picked)
    assert got["tau"] == pytest.approx(claimed, rel=0.1)
    assert f"τ = {measured['tau']:.2f}" in (folder / "README.md").read_text()
