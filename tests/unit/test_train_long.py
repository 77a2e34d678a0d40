"""zoo:ar-long's training rows (fastdecode/train/long.py): extra questions read back from the context are right,
the loss mask covers exactly the answers and their EOS, and a stage trains and extends positions."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest
import torch
from transformers import AutoTokenizer

from fastdecode.bench.tasks.longctx import OPS
from fastdecode.models.loading import resolve
from fastdecode.train import long

TASKS = {cls.op: cls("1k") for cls in OPS}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve("zoo:ar-small"))


@pytest.mark.parametrize("op", ["kv", "multikey", "after"])
def test_more_questions_are_answered_by_the_context(op):
    task = TASKS[op]
    task.context = 300
    item = task.make_item(random.Random(1))
    more = long._more_questions(op, item.prompt, item.reference, random.Random(2), 3)
    assert len(more) == 3
    for question, answer in more:
        assert answer != item.reference  # never the first question again: its answer is already in the row
        if op == "kv":
            key = question.removeprefix("What is the value of key ").removesuffix("?")
            assert f"key {key} value {answer}." in item.prompt
        elif op == "multikey":
            person = question.removeprefix("What is the special number of ").removesuffix("?")
            assert f"The special number of {person} is {answer}." in item.prompt
        else:
            person = question.removeprefix("Who comes after ").removesuffix(" in the waiting line?")
            assert f"{person}, {answer}" in item.prompt and item.prompt.count(person + ",") == 1


def test_passkey_and_vartrack_ask_one_question():
    for op in ("passkey", "vartrack"):
        item = TASKS[op].make_item(random.Random(0))
        assert long._more_questions(op, item.prompt, item.reference, random.Random(0), 5) == []


def test_batch_masks_exactly_the_answers_and_their_eos(tokenizer):
    task = TASKS["kv"]
    ids, mask = long._batch(tokenizer, task, 200, 3, random.Random(0), questions=4)
    assert ids.shape[0] == mask.shape[0] == 3 and mask.shape[1] == ids.shape[1] - 1
    for row, m in zip(ids, mask, strict=True):
        targets = row[1:][m].tolist()
        eos = tokenizer.eos_token_id
        assert targets.count(eos) == 4 and targets[-1] == eos  # four answers, each closed by EOS
        answers = tokenizer.decode(targets).split(tokenizer.eos_token)[:-1]
        assert all(a.isdigit() and len(a) == 5 for a in answers)
        # the first question is the suite's own prompt, unchanged
        first = tokenizer.decode(row[: int(m.nonzero()[0]) + 1])
        assert first.endswith("?\nA: ") and first.count("\nA: ") == 1


def test_a_stage_trains_and_extends_positions(tokenizer):
    model, _ = long.load_init(str(resolve("zoo:ar-small")))
    before = [p.detach().clone() for p in model.parameters()]
    stage = long.Stage("t", steps=2, lr=1e-4, start=160, end=200, batch=2, questions=2, rope="base", factor=4.0,
                       positions=2048)
    log = long.run_stage(model, tokenizer, stage, random.Random(0))
    assert [r["step"] for r in log] == [0, 1] and all(torch.isfinite(torch.tensor(r["loss"])) for r in log)
    assert model.config.rope_parameters["rope_theta"] == 40000.0 and model.config.max_position_embeddings == 2048
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_train_ar_long_refuses_recipe_overrides(tmp_path):
    p = subprocess.run([sys.executable, "-m", "fastdecode", "train", "ar-long", "--steps", "3", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "FASTDECODE_DEBUG": "0"})
    assert p.returncode == 2 and "python -m fastdecode.train.long" in p.stderr
    assert not any(tmp_path.iterdir())  # refused before anything is trained or written
