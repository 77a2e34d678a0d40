"""The shipped DFlash head of zoo:ar-small does what its card says, on a few of the card's own items: spec.dflash
finds it with no flag, stays equal to ar.greedy, and reaches the card's acceptance (τ and the first draft position's
rate, measured on the first test item of a few parallel-lists tasks, which are among the card's items)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

import fastdecode
from fastdecode.heads.dflash import DFlashHead
from fastdecode.speculative.drafters.dflash import dflash_head
from fastdecode.train.measure import measure_tau, suite_prompts

FOLDER = Path(str(resources.files("fastdecode") / "zoo" / "ar-small" / "heads" / "dflash"))
TASKS = 3  # the first item of the first three parallel-lists tasks
SLACK = 0.75  # a few items vary around the card's average over 56: claim at least this share of its τ
FIRST = 0.6  # ... and of its first position's acceptance (a rarer event: fewer draws on 3 items)


@pytest.fixture(scope="module")
def target():
    return fastdecode.load("zoo:ar-small")


def test_the_card_describes_the_shipped_head():
    card = json.loads((FOLDER / "card.json").read_text())
    assert card["kind"] == "dflash" and card["target"] == "zoo:ar-small"
    assert card["measured"]["method"] == "spec.dflash" and card["measured"]["tau"] > 1.0
    assert (FOLDER / "model.safetensors").stat().st_size < 10_000_000  # bfloat16, under the 10 MB budget


def test_card_tau_holds_on_a_few_of_its_items(target):
    card = json.loads((FOLDER / "card.json").read_text())["measured"]
    assert isinstance(dflash_head(target), DFlashHead)  # found with no flag
    prompts = suite_prompts("parallel-lists", 1)[:TASKS]
    got = measure_tau(target, "spec.dflash", {}, prompts)  # greedy, as the card measured it
    base = fastdecode.generate(target, prompts, "ar.greedy", max_new_tokens=256)
    assert got["tokens"] == sum(len(r.token_ids) for r in base)
    one = fastdecode.generate(target, prompts[0], "spec.dflash", max_new_tokens=256)
    assert one.token_ids == base[0].token_ids
    assert got["tau"] >= SLACK * card["tau"]
    assert got["accept_per_position"][0] >= FIRST * card["accept_per_position"][0]
