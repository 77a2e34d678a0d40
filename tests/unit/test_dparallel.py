"""dParallel's training (fastdecode/train/dparallel.py, objectives/dparallel.py) on the tiny test model: the
semi-autoregressive masks, the certainty-forcing loss, the teacher's answers (scored, cached), and a run that saves
a loadable bfloat16 student and resumes an interrupted run to exactly the same weights."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import fastdecode
from fastdecode.errors import ParameterError
from fastdecode.train import dparallel
from fastdecode.train.objectives.dparallel import certainty_forcing, semi_ar_masks

TASKS = "letters.copy,letters.reverse"  # short prompts: the tiny model has 128 positions


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTDECODE_CACHE", str(tmp_path / "cache"))
    torch.set_num_threads(1)


def settings(**changes) -> dparallel.DParallelTraining:
    base = dict(items=6, steps=4, batch_tokens=512, checkpoint_every=2, eval_per_task=0, tasks=TASKS, warmup=2,
                lr=1e-3)
    return dparallel.DParallelTraining(**{**base, **changes})


def test_semi_ar_masks_split_one_block_and_mask_everything_after_it():
    answer = torch.zeros(3, 60, dtype=torch.bool)
    answer[0, 10:42] = True  # two blocks
    answer[1, 5:53] = True  # three blocks
    answer[2, 20:30] = True  # one short block
    seen: set[tuple[int, int]] = set()
    for seed in range(40):
        first, second, later = semi_ar_masks(answer, torch.Generator().manual_seed(seed), block=16)
        block = first | second
        assert not (first & second).any() and not ((block | later) & ~answer).any()
        for b in range(3):
            cols = block[b].nonzero().flatten()
            start = int(answer[b].nonzero()[0])
            k = (int(cols[0]) - start) // 16
            seen.add((b, k))
            assert (int(cols[0]) - start) % 16 == 0  # blocks counted from the answer's start, as the decoder's
            assert cols.tolist() == list(range(int(cols[0]), min(int(cols[0]) + 16, start + int(answer[b].sum()))))
            assert later[b].nonzero().flatten().tolist() == list(range(int(cols[-1]) + 1, start + int(answer[b].sum())))
    assert seen == {(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (2, 0)}  # every block is drawn


def test_the_entropy_term_is_added_on_correct_predictions_only(diffusion):
    model = diffusion.model.float()
    ids = torch.randint(4, 300, (2, 40)).to(diffusion.device)  # the loss runs where the model is
    attention = torch.ones(2, 40, dtype=torch.long, device=diffusion.device)
    answer = torch.zeros(2, 40, dtype=torch.bool, device=diffusion.device)
    answer[:, 8:40] = True
    loss, parts = certainty_forcing(model, ids, attention, answer, 3, torch.Generator().manual_seed(0))
    plain, plain_parts = certainty_forcing(model, ids, attention, answer, 3, torch.Generator().manual_seed(0),
                                           entropy_weight=0.0)
    assert torch.isfinite(loss) and 0.0 <= parts["acc"] <= 1.0
    assert loss.item() == pytest.approx(parts["ce"] + 2.0 * parts["entropy"], rel=1e-4)
    assert plain.item() == pytest.approx(plain_parts["ce"], rel=1e-4)
    if parts["acc"] == 0.0:  # a random model predicts no label: nothing to make certain of
        assert parts["entropy"] == 0.0
    loss.backward()
    assert model.model.embed_tokens.weight.grad is not None
    model.zero_grad(set_to_none=True)


def test_teacher_answers_are_its_own_scored_and_cached(diffusion, monkeypatch):
    rows = dparallel.teacher_answers(diffusion, 1, 5, tasks=TASKS)
    assert [r["index"] for r in rows] == list(range(5)) and {r["task"] for r in rows} <= set(TASKS.split(","))
    for r in rows:
        alone = fastdecode.generate(diffusion, [r["prompt"]], "dlm.baseline", max_new_tokens=r["canvas"],
                                    block_length=16)[0]
        assert r["answer"] == alone.token_ids and 0.0 <= r["score"] <= 1.0
    monkeypatch.setattr(dparallel, "generate", lambda *a, **k: pytest.fail("the cached answers were decoded again"))
    assert dparallel.teacher_answers(diffusion, 1, 5, tasks=TASKS) == rows
    kept = dparallel.training_examples([{**r, "score": 1.0} for r in rows], eos=1)
    assert all(len(e.ids) - e.prompt_len == r["canvas"] for e, r in zip(kept, rows, strict=True))  # EOS-padded


def test_a_run_saves_a_student_and_an_interrupted_run_resumes_to_the_same_weights(diffusion, tmp_path, monkeypatch):
    # the tiny random teacher answers nothing right: count every answer as correct so that there is data
    keep = dparallel.training_examples
    monkeypatch.setattr(dparallel, "training_examples",
                        lambda rows, eos: keep([{**r, "score": 1.0} for r in rows], eos))
    whole = tmp_path / "whole"
    card = dparallel.build(whole, 2, 1, settings(), "fastdecode train dparallel", teacher=diffusion)
    assert card["data"]["kept"] == 6 and len(json.loads((whole / "card.json").read_text())["training"]) > 5
    student = fastdecode.load(whole)
    assert student.kind == "diffusion" and not (whole / "checkpoint").exists()
    assert all(v.dtype == torch.bfloat16 for v in load_file(str(whole / "model.safetensors")).values())

    class Stop(Exception):
        pass

    def stop_at_3(phase, done, total, metrics):
        if phase == "train" and done == 3:
            raise Stop

    cut = tmp_path / "cut"
    with pytest.raises(Stop):
        dparallel.build(cut, 2, 1, settings(), "x", report=stop_at_3, teacher=diffusion)
    assert json.loads((cut / "checkpoint" / "state.json").read_text())["step"] == 2
    with pytest.raises(ParameterError, match="another run"):
        dparallel.build(cut, 3, 1, settings(), "x", teacher=diffusion)
    seen = []
    dparallel.build(cut, 2, 1, settings(), "x", report=lambda p, d, t, m: seen.append((p, d)), teacher=diffusion)
    assert [d for p, d in seen if p == "train"] == [3, 4]  # steps 1-2 came from the checkpoint
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(cut / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_bad_settings_are_refused_with_the_fix():
    with pytest.raises(ParameterError, match="Unknown dparallel setting"):
        dparallel.parse_settings({"learning_rate": "1"})
    with pytest.raises(ParameterError, match="takes a float"):
        dparallel.parse_settings({"lr": "fast"})
    assert dparallel.parse_settings({"steps": "7"}).steps == 7
