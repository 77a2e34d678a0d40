"""The bundled zoo models: load paths, tokenizer, cards, and one scored item per task each."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

import fastdecode
from fastdecode.bench.tasks import DEFAULT_TEST_SEED, TASKS, format_prompt
from fastdecode.models.loading import resolve, zoo_names

# the text models; an image model (image.json: zoo:img-ar) has its own tests in tests/image/test_img_ar_zoo.py
ZOO = [name for name in zoo_names() if not (resolve(f"zoo:{name}") / "image.json").is_file()]
COMMANDS = {"dlm-small-dparallel": "dparallel"}  # `fastdecode train COMMAND` when it is not the model's name
pytestmark = pytest.mark.skipif(not ZOO, reason="no zoo model is bundled yet (docs/zoo.md: fastdecode train ar-small)")


def test_zoo_is_bundled_and_small():
    assert "ar-small" in ZOO
    total = sum(f.stat().st_size for name in ZOO for f in resolve(f"zoo:{name}").iterdir())
    # ar-small, ar-tiny and dlm-small in float32, ar-long and dlm-small-dparallel in bfloat16: 129 MB (ar-long
    # alone brought the zipped wheel to 97.5 MB, under PyPI's default 100 MB per file; the distilled model takes it
    # over: docs/zoo.md, "dlm-small-dparallel")
    assert total <= 130 * 2**20


@pytest.mark.parametrize("name", ZOO)
def test_loads_through_fastdecode_and_auto_classes(name):
    model = fastdecode.load(f"zoo:{name}")
    folder = resolve(f"zoo:{name}")
    auto = AutoModelForCausalLM if model.kind == "causal" else AutoModel
    assert type(auto.from_pretrained(folder)) is type(model.model)
    tok = AutoTokenizer.from_pretrained(folder)
    text = 'Q: Sort this waiting line: ["Ann Lee", "Bob Moss"]\nA: def f(x):\n\treturn x  # ünïcode'
    assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text
    special = {tok.bos_token, tok.eos_token, tok.pad_token, tok.mask_token}
    assert special == {"<|bos|>", "<|eos|>", "<|pad|>", "<|mask|>"}


@pytest.mark.parametrize("name", ZOO)
def test_card_records_command_time_and_accuracy(name):
    card = (resolve(f"zoo:{name}") / "README.md").read_text()
    command = COMMANDS.get(name, name)
    assert f"fastdecode train {command}" in card and "minutes" in card
    metrics = json.loads(card.split("```json")[1].split("```")[0])
    if name == "dlm-small-dparallel":  # the distilled model beside its teacher, with two commit rules
        assert {"student/dlm.threshold", "teacher/dlm.threshold"} <= set(metrics)
        assert all(0.0 <= m["accuracy"] <= 1.0 and m["tpf"] > 0 for m in metrics.values())
    elif name == "ar-long":  # the long-context model is measured on the longctx suite at each card length
        assert set(metrics["mean_accuracy"]) == {"1k", "2k", "4k"} and metrics["items_per_task"] >= 10
        assert all(0.0 <= v <= 1.0 for v in metrics["accuracy"].values())
    else:
        assert 0.0 <= metrics["mean_deterministic_list_accuracy"] <= 1.0


@pytest.mark.parametrize("name", ZOO)
def test_smoke_one_item_per_task(name):
    model = fastdecode.load(f"zoo:{name}")
    method = "ar.greedy" if model.kind == "causal" else "dlm.baseline"
    for task in TASKS.values():
        item = task.items(DEFAULT_TEST_SEED, 1)[0]
        # a diffusion model decodes on the canvas the benchmark fits to the task (its card's setting), not on the
        # task's generous cap of new tokens, where one token per step would cost hundreds of forwards
        n = task.canvas_length(model.tokenizer) if model.kind == "diffusion" else task.max_new_tokens
        r = fastdecode.generate(model, format_prompt(item.prompt), method, max_new_tokens=n)
        score = task.score(item, r.text)
        assert 0.0 <= score <= 1.0 and r.stats.new_tokens >= 1


def _items(n_tasks: int = 4) -> list[str]:
    names = ["lists.sort", "letters.reverse", "puzzles.sudoku", "code.complete"][:n_tasks]
    return [format_prompt(TASKS[t].items(DEFAULT_TEST_SEED, 1)[0].prompt) for t in names]


@pytest.mark.skipif("ar-small" not in ZOO, reason="zoo:ar-small is not bundled")
def test_lossless_speculative_methods_equal_greedy_on_the_zoo():
    """Every lossless spec.* method reproduces ar.greedy on zoo:ar-small, with its zoo drafter where it takes one."""
    target = fastdecode.load("zoo:ar-small")
    drafts = {kind: fastdecode.load(f"zoo:{name}") for kind, name in (("causal", "ar-tiny"), ("diffusion", "dlm-small"))
              if name in ZOO}
    prompts = _items()
    expected = [r.token_ids for r in fastdecode.generate(target, prompts, "ar.greedy", max_new_tokens=48)]
    checked = 0
    for method in fastdecode.methods("causal"):
        if not method.lossless or not method.name.startswith("spec."):
            continue
        if method.needs_draft and method.draft_kind not in drafts:
            continue
        draft = drafts[method.draft_kind] if method.needs_draft else None
        got = [r.token_ids for r in fastdecode.generate(target, prompts, method.name, max_new_tokens=48, draft=draft)]
        assert got == expected, method.name
        checked += 1
    assert checked >= 10


@pytest.mark.skipif("dlm-small" not in ZOO, reason="zoo:dlm-small is not bundled")
def test_freedave_equals_the_baseline_on_the_zoo():
    model = fastdecode.load("zoo:dlm-small")
    prompts = _items(3)
    base = fastdecode.generate(model, prompts, "dlm.baseline", max_new_tokens=32, block_length=16)
    fast = fastdecode.generate(model, prompts, "dlm.freedave", max_new_tokens=32, block_length=16)
    assert [r.token_ids for r in fast] == [r.token_ids for r in base]
    assert sum(r.stats.forwards for r in fast) < sum(r.stats.forwards for r in base)
