"""Every task's scorer, exercised through the harness with an oracle method (the reference) and a wrong one."""

from __future__ import annotations

import pytest

from fastdecode import registry
from fastdecode.bench.harness import read_rows, run_bench
from fastdecode.bench.suites import Suite
from fastdecode.bench.tasks import DEFAULT_TEST_SEED, TASKS, format_prompt
from fastdecode.config import MethodConfig
from fastdecode.types import StepEvent

SUITE = Suite("scorers", "one item of every task", tuple((name, 1) for name in TASKS))


def emit(ids: list[int]):
    """Four tokens per step, reported as a draft of 4 with 3 accepted plus one, like a speculative method."""
    for step, start in enumerate(range(0, len(ids), 4)):
        chunk = ids[start : start + 4]
        yield StepEvent(step, (tuple(enumerate(chunk, start)),), proposed=(4,), accepted=(len(chunk) - 1,),
                        finished=(start + 4 >= len(ids),))


@pytest.fixture
def test_methods(target):
    answers = {}
    for task in TASKS.values():
        item = task.items(DEFAULT_TEST_SEED, 1)[0]
        reference = target.tokenizer(item.reference, add_special_tokens=False)["input_ids"]
        answers[tuple(target.encode(format_prompt(item.prompt)))] = reference
    eos = min(target.eos_token_ids)

    @registry.register("test.oracle", kind="causal", config=MethodConfig)
    def oracle(model, batch, cfg, ctx):
        """Answers with the task's reference (test only)."""
        return emit(answers[tuple(batch.row(0))] + [eos])

    @registry.register("test.wrong", kind="causal", config=MethodConfig)
    def wrong(model, batch, cfg, ctx):
        """Answers with nothing (test only)."""
        return emit([eos])

    yield
    del registry._METHODS["test.oracle"], registry._METHODS["test.wrong"]


def test_oracle_scores_one_and_wrong_scores_zero(target, tmp_path, test_methods):
    out = tmp_path / "scores.jsonl"
    run_bench(SUITE, target, ["test.oracle", "test.wrong"], out, params={"ar.greedy": {"max_new_tokens": 2}},
              warmup=False)
    rows = read_rows(out)
    oracle = {r["task"]: r for r in rows if r["method"] == "test.oracle"}
    wrong = {r["task"]: r for r in rows if r["method"] == "test.wrong"}
    assert set(oracle) == set(wrong) == set(TASKS)
    for task, r in oracle.items():
        assert r["score"] == 1.0, (task, r["output"])
        assert all(v == 1.0 for v in r["scores"].values())
        assert r["output"] == TASKS[task].items(DEFAULT_TEST_SEED, 1)[0].reference
        assert 0 < r["accepted"] <= r["proposed"]
        assert r["tokens_per_forward"] == pytest.approx(r["new_tokens"] / r["forwards"])
    for task, r in wrong.items():
        assert r["score"] == 0.0 and all(v == 0.0 for v in r["scores"].values()), task
        assert r["new_tokens"] == 1 and r["finish_reason"] == "eos"
    assert oracle["code.complete"]["scores"] == {"first_line_exact": 1.0}


def test_test_methods_are_removed_afterwards():
    assert "test.oracle" not in {m.name for m in registry.list_methods()}
