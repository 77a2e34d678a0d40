"""The head-training loop on the tiny test model: self-distilled data is the target's own greedy output and is read
back from the cache; a run saves a head that decodes losslessly, with its card; an interrupted run resumes to
exactly the weights of an uninterrupted one; bad settings are refused with the fix named."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import fastdecode
from fastdecode.errors import ParameterError
from fastdecode.heads import load_head
from fastdecode.train import selfdata
from fastdecode.train.heads import HeadTraining, split_settings, train_head

TASKS = "letters.copy,letters.reverse"  # short prompts: the tiny model has 128 positions


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTDECODE_CACHE", str(tmp_path / "cache"))
    torch.set_num_threads(1)


def settings(**changes) -> HeadTraining:
    base = dict(steps=4, items=12, held_out=4, batch_tokens=512, checkpoint_every=2, eval_per_task=0, tasks=TASKS,
                warmup=2)
    return HeadTraining(**{**base, **changes})


def test_self_distilled_answers_are_the_targets_greedy_ones_and_are_cached(causal, monkeypatch):
    data = selfdata.self_distilled(causal, seed=3, n_items=5, batch=2, tasks=tuple(TASKS.split(",")))
    assert len(data) == 5 and {e.task for e in data} <= set(TASKS.split(","))
    for e in data:
        alone = fastdecode.generate(causal, [e.ids[: e.prompt_len]], "ar.greedy", max_new_tokens=48)[0]
        assert e.ids[e.prompt_len :] == alone.token_ids
    monkeypatch.setattr(selfdata, "generate", lambda *a, **k: pytest.fail("the cached data was regenerated"))
    again = selfdata.self_distilled(causal, seed=3, n_items=5, tasks=tuple(TASKS.split(",")))
    assert again == data
    assert selfdata.regeneration(causal, 3, 5, tuple(TASKS.split(",")))["items"] == 5


@pytest.mark.parametrize("kind", ["medusa", "hydra"])
def test_a_trained_head_decodes_losslessly_and_has_its_card(causal, tmp_path, kind):
    out = tmp_path / kind
    card = train_head(causal, kind, out, seed=1, cfg=settings(), command="fastdecode train drafter ...")
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4] and all(r["loss"] > 0 and r["answer_tokens"] > 0 for r in log)
    assert card["trained_tokens"] == sum(r["tokens"] for r in log) and set(card["held_out"]) >= {"acc0", "acc1"}
    assert not (out / "checkpoint").exists()
    assert json.loads((out / "card.json").read_text())["command"] == "fastdecode train drafter ..."
    assert "fastdecode train drafter ..." in (out / "README.md").read_text()
    head = load_head(out)
    assert head.kind == kind and {t.dtype for t in load_file(str(out / "model.safetensors")).values()} == {
        torch.bfloat16}
    prompts = ["the quick brown fox", "def add(a, b):"]
    base = fastdecode.generate(causal, prompts, "ar.greedy", max_new_tokens=24)
    got = fastdecode.generate(causal, prompts, "spec.medusa", max_new_tokens=24, head=str(out),
                              hydra=kind == "hydra")
    assert [r.token_ids for r in got] == [r.token_ids for r in base]


def test_an_interrupted_run_resumes_to_the_same_head(causal, tmp_path):
    whole = tmp_path / "whole"
    train_head(causal, "medusa", whole, seed=2, cfg=settings())

    class Stop(Exception):
        pass

    def stop_at_3(phase, done, total, metrics):
        if phase == "train" and done == 3:
            raise Stop

    cut = tmp_path / "cut"
    with pytest.raises(Stop):
        train_head(causal, "medusa", cut, seed=2, cfg=settings(), report=stop_at_3)
    assert json.loads((cut / "checkpoint" / "state.json").read_text())["step"] == 2
    seen = []
    train_head(causal, "medusa", cut, seed=2, cfg=settings(), report=lambda p, d, t, m: seen.append((p, d)))
    assert [d for p, d in seen if p == "train"] == [3, 4]  # steps 1-2 came from the checkpoint
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(cut / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (whole / "train_log.jsonl").read_text() == (cut / "train_log.jsonl").read_text()


def test_a_checkpoint_of_another_run_is_refused(causal, tmp_path):
    out = tmp_path / "h"

    def stop(phase, done, total, metrics):
        if phase == "train" and done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_head(causal, "medusa", out, seed=0, cfg=settings(), report=stop)
    with pytest.raises(ParameterError, match="checkpoint of another run"):
        train_head(causal, "medusa", out, seed=5, cfg=settings())


def test_settings_split_into_training_fields_and_head_options():
    cfg, options = split_settings({"lr": "0.01", "steps": "7", "num_heads": "3", "tie_lm_head": "false"})
    assert (cfg.lr, cfg.steps) == (0.01, 7) and options == {"num_heads": 3, "tie_lm_head": False}
    with pytest.raises(ParameterError, match="steps takes a int"):
        split_settings({"steps": "many"})
    with pytest.raises(ParameterError, match="Unknown task"):
        selfdata.mixture(("lists.nope",))
