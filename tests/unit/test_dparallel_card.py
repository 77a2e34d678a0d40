"""The shipped zoo:dlm-small-dparallel does what its card says on a few of the card's own items: it loads by its zoo
name, and dlm.threshold (blocks of 16, batch of one, as the card measured) gives the card's score, tokens and
forwards on the first test item of the tasks where the card has the student take fewer forwards than its teacher,
and fewer forwards than the teacher there."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import fastdecode
from fastdecode.bench.evaluate import default_budget
from fastdecode.bench.suites import SUITES
from fastdecode.bench.tasks import DEFAULT_TEST_SEED, TASKS, format_prompt

FOLDER = Path(str(resources.files("fastdecode") / "zoo" / "dlm-small-dparallel"))
CHECKED = 3  # tasks re-measured (their first item each)
pytestmark = pytest.mark.skipif(not (FOLDER / "card.json").is_file(), reason="zoo:dlm-small-dparallel is not bundled")


def card() -> dict:
    return json.loads((FOLDER / "card.json").read_text())


def test_the_card_describes_the_shipped_model():
    c = card()
    assert c["teacher"] == "zoo:dlm-small" and c["data"]["kept"] <= c["data"]["items"]
    assert {"student/dlm.threshold", "teacher/dlm.threshold", "student/dlm.entropy_bound"} <= set(c["measured"])
    assert all(v.dtype == torch.bfloat16 for v in load_file(str(FOLDER / "model.safetensors")).values())
    assert "fastdecode train dparallel" in (FOLDER / "README.md").read_text()


def _first_items(c: dict) -> list[tuple[str, int]]:
    """(task, index into the card's per-item records) of the first item of the tasks where the student took fewer
    forwards than the teacher with dlm.threshold."""
    per_task = c["eval_per_task"]
    student = c["measured"]["student/dlm.threshold"]["per_item"]
    teacher = c["measured"]["teacher/dlm.threshold"]["per_item"]
    names = [name for name, _ in SUITES["parallel-lists"].tasks]
    at = [(name, i * per_task) for i, name in enumerate(names)]
    return [(name, k) for name, k in at if student[k][2] < teacher[k][2]][:CHECKED]


def _run(model, task: str) -> tuple[float, int, int]:
    item = TASKS[task].items(DEFAULT_TEST_SEED, 1)[0]
    r = fastdecode.generate(model, format_prompt(item.prompt), "dlm.threshold",
                            max_new_tokens=default_budget(TASKS[task], model), block_length=16)
    return TASKS[task].score(item, r.text), r.stats.new_tokens, r.stats.forwards


def test_card_items_reproduce_with_fewer_forwards_than_the_teacher():
    c = card()
    chosen = _first_items(c)
    assert chosen, "the card shows no item where the student is faster: nothing to check"
    student = fastdecode.load("zoo:dlm-small-dparallel")
    teacher = fastdecode.load("zoo:dlm-small")
    recorded = c["measured"]["student/dlm.threshold"]["per_item"]
    for task, k in chosen:
        score, tokens, forwards = _run(student, task)
        assert score == recorded[k][0] and tokens == recorded[k][1], task
        assert abs(forwards - recorded[k][2]) <= 1, task  # a near-threshold commit may differ on another CPU
        assert forwards < _run(teacher, task)[2], task
