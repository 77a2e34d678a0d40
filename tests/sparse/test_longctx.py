"""The longctx tasks: prompts fill their context length (zoo tokenizer), scorers are exact, items repeat."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from fastdecode.bench.suites import get_suite
from fastdecode.bench.tasks import DEFAULT_TEST_SEED, LONG_TASKS, TASKS, format_prompt, get_task, list_tasks
from fastdecode.models.loading import resolve


@pytest.fixture(scope="module")
def zoo_tokenizer():
    return AutoTokenizer.from_pretrained(resolve("zoo:ar-small"))


@pytest.mark.parametrize("size", ["1k", "4k"])
def test_prompts_fill_their_context_length(zoo_tokenizer, size):
    for op in ("passkey", "multikey", "kv", "vartrack", "after"):
        task = get_task(f"longctx.{op}@{size}")
        for item in task.items(DEFAULT_TEST_SEED, 2):
            n = len(zoo_tokenizer(format_prompt(item.prompt))["input_ids"])
            assert 0.9 * task.context <= n <= 1.05 * task.context, (task.name, n)


def test_scorers_are_exact_and_items_repeat():
    for name, task in LONG_TASKS.items():
        if not name.endswith("@1k"):
            continue
        a, b = task.items(DEFAULT_TEST_SEED, 3), task.items(DEFAULT_TEST_SEED, 3)
        assert a == b
        for item in a:
            assert task.score(item, item.reference) == 1.0
            assert task.score(item, item.reference + "\nmore text") == 1.0
            assert task.score(item, "12") == 0.0
    vt = get_task("longctx.vartrack@1k").items(DEFAULT_TEST_SEED, 1)[0]
    names = vt.data["names"]
    assert get_task("longctx.vartrack@1k").score(vt, ", ".join(reversed(names))) == 1.0
    assert get_task("longctx.vartrack@1k").score(vt, ", ".join(names[:-1])) == 0.0


def test_needles_are_in_the_prompt_and_the_asked_name_is_unique():
    for item in get_task("longctx.after@16k").items(DEFAULT_TEST_SEED, 2):
        line = item.prompt.split("\n")[0]
        person = item.data["person"]
        assert line.count(person + ",") == 1 and f"{person}, {item.reference}" in line
    for op in ("passkey", "multikey", "kv"):
        item = get_task(f"longctx.{op}@2k").items(DEFAULT_TEST_SEED, 1)[0]
        assert item.reference in item.prompt


def test_long_tasks_stay_out_of_the_training_registry():
    assert not any(name.startswith("longctx.") for name in TASKS)
    assert len(list_tasks("longctx")) == 25
    plan = get_suite("longctx").plan(limit=2)
    assert {t.name.split("@")[1] for t, _, _ in plan} == {"1k", "2k", "4k"}
