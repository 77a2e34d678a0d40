"""The bundled zoo models: load paths, tokenizer, cards, and one scored item per task each."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

import fastdecode
from fastdecode.bench.tasks import DEFAULT_TEST_SEED, TASKS, format_prompt
from fastdecode.models.loading import resolve, zoo_names

ZOO = zoo_names()
pytestmark = pytest.mark.skipif(not ZOO, reason="no zoo model is bundled yet (docs/zoo.md: fastdecode train ar-small)")


def test_zoo_is_bundled_and_small():
    assert "ar-small" in ZOO
    total = sum(f.stat().st_size for name in ZOO for f in resolve(f"zoo:{name}").iterdir())
    assert total <= 100 * 2**20


@pytest.mark.parametrize("name", ZOO)
def test_loads_through_fastdecode_and_auto_classes(name):
    model = fastdecode.load(f"zoo:{name}")
    folder = resolve(f"zoo:{name}")
    auto = AutoModelForCausalLM if model.kind == "causal" else AutoModel
    assert type(auto.from_pretrained(folder)) is type(model.model)
    tok = AutoTokenizer.from_pretrained(folder)
    text = 'Q: Sort this waiting line: ["Ann Lee", "Bob Moss"]\nA: def f(x):\n\treturn x  # ünïcode'
    assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text
    assert {tok.bos_token, tok.eos_token, tok.pad_token, tok.mask_token} == {"<|bos|>", "<|eos|>", "<|pad|>", "<|mask|>"}


@pytest.mark.parametrize("name", ZOO)
def test_card_records_command_time_and_accuracy(name):
    card = (resolve(f"zoo:{name}") / "README.md").read_text()
    assert f"fastdecode train {name}" in card and "minutes" in card
    metrics = json.loads(card.split("```json")[1].split("```")[0])
    assert 0.0 <= metrics["mean_deterministic_list_accuracy"] <= 1.0


@pytest.mark.parametrize("name", ZOO)
def test_smoke_one_item_per_task(name):
    model = fastdecode.load(f"zoo:{name}")
    method = "ar.greedy" if model.kind == "causal" else "dlm.baseline"
    for task in TASKS.values():
        item = task.items(DEFAULT_TEST_SEED, 1)[0]
        r = fastdecode.generate(model, format_prompt(item.prompt), method, max_new_tokens=task.max_new_tokens)
        score = task.score(item, r.text)
        assert 0.0 <= score <= 1.0 and r.stats.new_tokens >= 1
