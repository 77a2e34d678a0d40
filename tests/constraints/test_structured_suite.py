"""The structured suite's constraints: every zoo task of the suite has one, and it accepts the task's reference
answers (so a constrained run can still be right); the JSON-schema classes compile for the zoo tokenizer."""

from __future__ import annotations

import pytest

import fastdecode
from fastdecode.bench.suites import get_suite
from fastdecode.bench.tasks import TASKS
from fastdecode.bench.tasks.structured import SCHEMA_TASKS, TASK_CONSTRAINTS


@pytest.fixture(scope="module")
def zoo():
    return fastdecode.load("zoo:ar-small")


def test_every_structured_task_accepts_its_references(zoo):
    eos = sorted(zoo.eos_token_ids)[0]
    for name, _ in get_suite("structured").tasks:
        for item in TASKS[name].items(1_000_000, 5):
            compiled = TASK_CONSTRAINTS[name](item).compile(zoo)
            ids = zoo.tokenizer.encode(item.reference, add_special_tokens=False) + [eos]
            assert compiled.grammar.start().advance(ids) == len(ids), (name, item.reference)


def test_schema_classes_compile_and_refuse_what_breaks_them(zoo):
    kinds = {t.name for t in SCHEMA_TASKS}
    assert {"schema.enum", "schema.nested", "schema.array_bounds", "schema.string_formats", "schema.anyof"} <= kinds
    for task in SCHEMA_TASKS:
        matcher = task.constraint().compile(zoo).grammar.start()
        assert bool(matcher.allowed().any()) and matcher.valid(zoo.tokenizer.encode("}", add_special_tokens=False)) == 0
