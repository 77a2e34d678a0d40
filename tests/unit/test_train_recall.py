"""zoo:ar-long's recall recipe (fastdecode/train/recall.py): MQAR rows are answerable from their records and
supervise exactly the queried values, the suite stages' rows come through, and a resumed stage ends with the
weights of an uninterrupted one. Tiny models, a few steps: no training run."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from fastdecode.bench.tasks.longctx import OPS
from fastdecode.errors import ParameterError
from fastdecode.models.loading import resolve
from fastdecode.train import recall
from fastdecode.train.checkpoint import load_checkpoint

TINY = recall.Shape(hidden=32, layers=2, heads=4, mlp=64, positions=2048)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve("zoo:ar-small"))


def test_pools_are_disjoint_halves_without_special_ids(tokenizer):
    pools = recall.mqar_pools(tokenizer, 100)
    assert len(pools.keys) == len(pools.values) == 100
    assert not set(pools.keys) & set(pools.values)
    assert not (set(pools.keys) | set(pools.values)) & set(tokenizer.all_special_ids)
    full = recall.mqar_pools(tokenizer)
    assert len(full.keys) + len(full.values) == len(tokenizer) - len(tokenizer.all_special_ids)


def test_mqar_rows_supervise_exactly_the_queried_values(tokenizer):
    pools = recall.mqar_pools(tokenizer, 64)
    pairs, queries = 12, 5
    ids, mask = recall.mqar_batch(pools, tokenizer.bos_token_id, 3, pairs, queries, random.Random(0))
    assert ids.shape == (3, 1 + 2 * pairs + 2 * queries) and mask.shape == (3, ids.shape[1] - 1)
    for row, m in zip(ids.tolist(), mask, strict=True):
        assert row[0] == tokenizer.bos_token_id
        keys, values = row[1 : 2 * pairs + 1 : 2], row[2 : 2 * pairs + 1 : 2]
        assert len(set(keys)) == pairs and set(keys) <= set(pools.keys) and set(values) <= set(pools.values)
        record = dict(zip(keys, values, strict=True))
        targets = torch.tensor(row[1:])[m].tolist()
        before = [row[i] for i in m.nonzero().flatten().tolist()]  # the token each target is predicted from
        assert len(targets) == queries and len(set(before)) == queries
        assert all(record[k] == v for k, v in zip(before, targets, strict=True))


def test_mqar_refuses_more_queries_than_pairs(tokenizer):
    with pytest.raises(ParameterError, match="lower --queries"):
        recall.mqar_batch(recall.mqar_pools(tokenizer, 8), 0, 1, 4, 5, random.Random(0))


def test_new_model_has_the_shape_asked(tokenizer):
    model = recall.new_model(tokenizer, TINY, 0)
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.head_dim) == (32, 2, 4, 8)
    assert cfg.vocab_size == len(tokenizer) and cfg.rope_parameters["rope_theta"] == TINY.rope_theta


def test_a_resumed_stage_ends_with_the_uninterrupted_weights(tokenizer, tmp_path):
    torch.set_num_threads(1)
    stage = recall.RecallStage("s", steps=3, lr=1e-3, tasks="mqar,kv", batch=2, pairs=8, queries=4, pool=32,
                               start=128, end=160, questions=2)
    whole = recall.new_model(tokenizer, TINY, 0)
    log = recall.train_stage(whole, tokenizer, stage, 0, tmp_path / "a", record={"seed": 0}, every=1)
    assert [(r["step"], r["task"]) for r in log] == [(0, "mqar"), (1, "kv"), (2, "mqar")]
    # stop after one step, then resume from the checkpoint into a fresh model and optimiser
    part = recall.new_model(tokenizer, TINY, 0)
    with pytest.raises(_Stop):  # interrupted in step 1, after step 0's checkpoint
        recall.train_stage(part, tokenizer, stage, 0, tmp_path / "b", record={"seed": 0}, every=1,
                           on_step=lambda row: _stop_after(row, 1))
    resumed = recall.new_model(tokenizer, TINY, 1)
    opt = torch.optim.AdamW(resumed.parameters(), lr=stage.lr, betas=(0.9, 0.95), weight_decay=0.0)
    rec = load_checkpoint(tmp_path / "b", {"model": resumed}, {"opt": opt}, {"seed": 0})
    assert rec is not None and rec["step"] == 1 and rec["stage"] == "s"
    recall.train_stage(resumed, tokenizer, stage, 0, tmp_path / "b", rec["step"], opt)
    for a, b in zip(whole.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)


class _Stop(Exception):
    pass


def _stop_after(row: dict, step: int) -> None:
    if row["step"] == step:
        raise _Stop


def test_steps_flag_scales_the_recipe_or_says_how():
    args = type("A", (), {"steps": "5,0,7"})()
    assert [(s.name, s.steps) for s in recall._stages(args)] == [("mqar", 5), ("length", 7)]
    with pytest.raises(ParameterError, match="one per stage"):
        recall._stages(type("A", (), {"steps": "5"})())


def test_cli_recall_recipe_wants_an_out_folder(tmp_path):
    p = subprocess.run([sys.executable, "-m", "fastdecode", "train", "ar-long", "--set", "recipe=recall"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "FASTDECODE_DEBUG": "0", "PYTHONPATH": str(Path(recall.__file__).parents[2])})
    assert p.returncode == 2 and "--out DIR" in p.stderr
    assert not any(tmp_path.iterdir())  # refused before anything is trained or written


def test_run_wires_the_stages_and_writes_the_folder(tmp_path):
    stages = (recall.RecallStage("mqar", steps=2, lr=1e-3, tasks="mqar", batch=2, pairs=6, queries=3, pool=16),
              recall.RecallStage("keys", steps=2, lr=1e-3, tasks="kv,multikey", batch=1, start=128, end=140,
                                 questions=2))
    summary = recall.run(tmp_path, 0, 1, TINY, stages, [], 1)
    rows = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert [(r["stage"], r.get("step", "end")) for r in rows[:-1]] == [
        ("mqar", 0), ("mqar", 1), ("mqar", "end"), ("keys", 0), ("keys", 1), ("keys", "end")]
    assert set(rows[5]["exact_match"]) == {f"longctx.{cls.op}@140" for cls in OPS}  # the suite stage's own check
    assert 0.0 <= summary["mqar_accuracy"]["mqar@6x3"] <= 1.0
    assert (tmp_path / "model.safetensors").is_file() and not (tmp_path / "checkpoint").exists()
