"""Training pieces: encoding matches inference, no test prompt leaks, batching, both objectives learn."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
import torch

import fastdecode
from fastdecode.bench.tasks import TASKS, format_prompt
from fastdecode.train.data import DEFAULT_MIXTURE, batches, collate, encode, held_out_prompts, item_stream
from fastdecode.train.loop import build_model, examples, train
from fastdecode.train.objectives.ar import ar_loss
from fastdecode.train.objectives.mdlm import mdlm_loss, training_canvas
from fastdecode.train.recipes import RECIPES, Recipe

ZOO = Path(fastdecode.__file__).parent / "zoo"


def test_encoding_matches_what_inference_feeds(tokenizer):
    item = TASKS["letters.reverse"].items(0, 1)[0]
    ex = encode(tokenizer, item)
    assert ex.ids[: ex.prompt_len] == tokenizer(format_prompt(item.prompt))["input_ids"]
    assert ex.ids[-1] == tokenizer.eos_token_id and ex.ids[0] == tokenizer.bos_token_id
    padded = encode(tokenizer, item, answer_pad_to=200)
    assert len(padded.ids) == padded.prompt_len + 200 and padded.ids[-1] == tokenizer.eos_token_id


def test_training_stream_uses_no_test_prompt():
    banned = held_out_prompts(50)
    mixture = {k: v for k, v in DEFAULT_MIXTURE.items() if not k.startswith("code.")}
    seen = [i.prompt for i in itertools.islice(item_stream(mixture, seed=0), 600)]
    assert not banned.intersection(seen)
    assert len({i.split(":")[0] for i in seen}) > 5  # a real mixture of tasks


def test_batches_respect_the_token_budget(tokenizer):
    mixture = {"letters.copy": 1.0, "lists.sort": 1.0}
    stream = (encode(tokenizer, i) for i in item_stream(mixture, seed=1))
    for batch in itertools.islice(batches(stream, max_tokens=600, pool=64), 20):
        ids, attention, answer = collate(batch, tokenizer.pad_token_id, max_len=384)
        assert ids.numel() <= 600 or len(batch) == 1
        assert (answer <= attention.bool()).all() and answer.any()


TINY = Recipe("t", "ar", 32, 1, 2, 1, 64, steps=30, lr=3e-3, warmup=5, batch_tokens=512,
              mixture={k: 0.0 for k in DEFAULT_MIXTURE} | {"letters.copy": 1.0})


def test_ar_training_lowers_the_loss(tokenizer):
    _, log = train(TINY, tokenizer, seed=0)
    first, last = log[0]["loss"], sum(r["loss"] for r in log[-5:]) / 5
    assert last < first - 1.0


def test_mdlm_loss_counts_only_masked_answer_tokens(tokenizer):
    model = build_model(Recipe("m", "mdlm", 32, 1, 2, 1, 64, steps=1, lr=1e-3), tokenizer)
    ids = torch.randint(4, 200, (2, 12))
    attention = torch.ones_like(ids)
    no_answer = torch.zeros_like(ids, dtype=torch.bool)
    gen = torch.Generator().manual_seed(0)
    assert mdlm_loss(model, ids, attention, no_answer, tokenizer.mask_token_id, gen).item() == 0.0
    answer = no_answer.clone()
    answer[:, 6:] = True
    assert mdlm_loss(model, ids, attention, answer, tokenizer.mask_token_id, gen).item() > 0.0
    assert ar_loss(build_model(TINY, tokenizer), ids, attention, answer).item() > 0.0


def test_shifted_mdlm_loss_scores_token_i_at_output_i_minus_1(tokenizer):
    model = build_model(Recipe("m", "mdlm", 32, 1, 2, 1, 64, steps=1, lr=1e-3, logits_shift=True), tokenizer).eval()
    assert model.config.logits_shift
    ids = torch.randint(4, 200, (2, 12))
    attention = torch.ones_like(ids)
    answer = torch.zeros_like(ids, dtype=torch.bool)
    answer[:, 6:] = True
    loss = mdlm_loss(model, ids, attention, answer, tokenizer.mask_token_id, torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(0)  # the same draws by hand
    p = (1 - 1e-3) * torch.rand(2, 1, generator=gen) + 1e-3
    masked = answer & (torch.rand(2, 12, generator=gen) < p)
    out = model(input_ids=ids.masked_fill(masked, tokenizer.mask_token_id)).logits
    ce = torch.nn.functional.cross_entropy(out[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")  # [2, 11]
    torch.testing.assert_close(loss, ((ce * masked[:, 1:] / p).sum(1) / 6).mean())


def test_ar_loss_equals_full_logits_cross_entropy_on_answer_tokens(tokenizer):
    model = build_model(TINY, tokenizer)
    ids = torch.randint(4, 200, (3, 10))
    attention = torch.ones_like(ids)
    attention[2, 7:] = 0  # a right-padded row
    answer = torch.zeros_like(ids, dtype=torch.bool)
    answer[:, 4:] = True
    answer[2, 7:] = False
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
    target = ids[:, 1:].masked_fill(~answer[:, 1:], -100)
    full = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                             ignore_index=-100)
    torch.testing.assert_close(ar_loss(model, ids, attention, answer), full)


def test_recipes_are_consistent():
    assert {"ar-small", "ar-tiny", "dlm-small"} <= set(RECIPES)
    assert RECIPES["dlm-small"].init_from == "ar-small"
    assert fastdecode.methods("causal")


def test_curriculum_draws_only_its_tasks_first(tokenizer, monkeypatch):
    import fastdecode.train.loop as loop

    seen = []
    real_collate = loop.collate
    monkeypatch.setattr(loop, "collate",
                        lambda batch, *a: seen.append({e.task for e in batch}) or real_collate(batch, *a))
    recipe = Recipe("c", "ar", 32, 1, 2, 1, 64, steps=6, lr=1e-3, warmup=1, batch_tokens=512,
                    curriculum={"letters.copy": 1.0}, curriculum_steps=3)
    train(recipe, tokenizer, seed=0)
    assert all(tasks == {"letters.copy"} for tasks in seen[:3])
    assert set().union(*seen[3:]) - {"letters.copy"}  # the full mixture afterwards


def test_long_canvas_pads_a_share_of_answers_to_longer_multiples_of_16():
    from transformers import AutoTokenizer

    from fastdecode import ParameterError

    tokenizer = AutoTokenizer.from_pretrained(ZOO / "ar-small")  # the tokenizer dlm-small trains with

    base = Recipe("d", "mdlm", 32, 1, 2, 1, 64, steps=1, lr=1e-3)
    task = TASKS["lists.copy"]
    fitted = task.canvas_length(tokenizer)
    rng = random.Random(0)
    assert {training_canvas(base, task, tokenizer, rng) for _ in range(50)} == {fitted}
    always = Recipe("d", "mdlm", 32, 1, 2, 1, 64, steps=1, lr=1e-3, long_canvas=1.0, long_canvas_to=256)
    drawn = {training_canvas(always, task, tokenizer, rng) for _ in range(400)}
    assert all(fitted < c <= 256 and c % 16 == 0 for c in drawn) and len(drawn) > 5
    some = Recipe("d", "mdlm", 32, 1, 2, 1, 64, steps=1, lr=1e-3, long_canvas=0.25, long_canvas_to=256)
    share = sum(training_canvas(some, task, tokenizer, rng) != fitted for _ in range(2000)) / 2000
    assert 0.2 < share < 0.3
    padded = [e for e in itertools.islice(examples(always, tokenizer, seed=0, mixture={"lists.copy": 1.0}), 20)]
    assert all((len(e.ids) - e.prompt_len) % 16 == 0 and len(e.ids) - e.prompt_len > fitted for e in padded)
    with pytest.raises(ParameterError, match="between 0 and 1"):
        Recipe("d", "mdlm", 32, 1, 2, 1, 64, steps=1, lr=1e-3, long_canvas=1.5)
    with pytest.raises(ParameterError, match="multiple of 16"):
        Recipe("d", "mdlm", 32, 1, 2, 1, 64, steps=1, lr=1e-3, long_canvas=0.5, long_canvas_to=100)


def test_recipe_overrides_for_trials():
    from fastdecode import ParameterError
    from fastdecode.train.recipes import get_recipe, override

    r = override(get_recipe("ar-small"), {"lr": "0.002", "num_layers": "4", "curriculum": '{"lists.copy": 1}'})
    assert (r.lr, r.num_layers, r.curriculum) == (0.002, 4, {"lists.copy": 1.0})
    import pytest

    with pytest.raises(ParameterError, match="Did you mean 'steps'"):
        override(r, {"stepz": "3"})
    with pytest.raises(ParameterError, match="JSON object"):
        override(r, {"curriculum": "copy"})


def test_words_pre_tokenizer_gives_a_name_one_token_wherever_it_stands():
    from fastdecode import ParameterError
    from fastdecode.train.recipes import get_recipe, override
    from fastdecode.train.tokenizer import train_tokenizer

    lists = ['["Kevin Evans", "Mike Walker"]', '["Mike Walker", "Kevin Evans"]', "[H, C, B]", "[C, H, B]"] * 50
    words = train_tokenizer(lists, 300, "words")
    ids = words('["Mike Walker", "Kevin Evans"]\n[C, H]', add_special_tokens=False)["input_ids"]
    pieces = words.convert_ids_to_tokens(ids)
    assert pieces.count("Mike") == 1 and pieces.count("Kevin") == 1 and "C" in pieces and "H" in pieces
    joined = train_tokenizer(lists, 300, "joined")  # the bundled models' splitting: the first item differs
    assert "Mike" not in joined.convert_ids_to_tokens(joined('["Mike Walker"]', add_special_tokens=False)["input_ids"])
    with pytest.raises(ParameterError, match="pre_tokenizer"):
        override(get_recipe("ar-small"), {"pre_tokenizer": "gpt2"})


def test_tokenizer_round_trips_and_keeps_digits_single(tokenizer):
    grid = "Solve:\n0320\n2140\n1200\n0000\nA: 4321"
    ids = tokenizer(grid, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == grid
    pieces = [tokenizer.decode([i]) for i in ids]
    assert all(len(p) == 1 for p in pieces if any(c.isdigit() for c in p))  # no '4321' or '00' merges
    text = 'def f(x):\n    return ["Ann Lee", 3.5]  # ünïcode ✓'
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


def _examples(tokenizer, mixture, n, seed=2, pad_to=None):
    return [encode(tokenizer, i, pad_to) for i in itertools.islice(item_stream(mixture, seed=seed), n)]


def test_packed_rows_keep_every_example_whole_and_mix_tasks(tokenizer):
    from fastdecode.train.data import packed_batches, packed_rows

    mixture = {"letters.copy": 1.0, "lists.sort": 1.0, "puzzles.sudoku": 1.0}
    exs = _examples(tokenizer, mixture, 64)
    source = iter(exs + _examples(tokenizer, mixture, 64, seed=3))
    rows = []
    for row in packed_rows(source, row_len=600, pool=64):
        rows.append(row)
        if sum(len(r) for r in rows) == 64:
            break
    assert sorted(id(e) for r in rows for e in r) == sorted(id(e) for e in exs)  # each example once, whole
    assert all(sum(len(e.ids) for e in r) <= 600 for r in rows)
    assert sum(len(e.ids) for e in exs) / (600 * len(rows)) > 0.8  # little padding
    batch = next(packed_batches(iter(exs * 10), row_len=600, max_tokens=2400, pool=64))
    assert len(batch) == 4 and len({e.task for r in batch for e in r}) == 3  # one batch, every task


def test_packed_ar_loss_equals_the_padded_batch_loss(tokenizer):
    from fastdecode.train.data import collate_packed

    model = build_model(TINY, tokenizer)
    exs = _examples(tokenizer, {"letters.copy": 1.0, "lists.reverse": 1.0}, 6)
    packed = collate_packed([exs[:3], exs[3:]], tokenizer.pad_token_id, row_len=1000)
    assert (packed.positions[packed.doc == 1] == 0).sum() == 2  # positions restart in every example
    ids, attention, answer = collate(exs, tokenizer.pad_token_id, max_len=1000)
    torch.testing.assert_close(ar_loss(model, packed.ids, packed.mask, packed.answer, packed.positions),
                               ar_loss(model, ids, attention, answer))


@pytest.mark.parametrize("shift", [False, True])
def test_packed_mdlm_rows_see_only_their_own_example(tokenizer, shift):
    from fastdecode.train.data import collate_packed

    model = build_model(Recipe("m", "mdlm", 32, 1, 2, 1, 64, steps=1, lr=1e-3, logits_shift=shift), tokenizer).eval()
    exs = _examples(tokenizer, {"letters.copy": 1.0, "lists.sort": 1.0}, 3, pad_to=24)
    packed = collate_packed([exs], tokenizer.pad_token_id, row_len=1000, causal=False)
    logits = model(input_ids=packed.ids, attention_mask=packed.mask, position_ids=packed.positions).logits
    at = 0
    for e in exs:
        alone = model(input_ids=torch.tensor([e.ids])).logits[0]
        torch.testing.assert_close(logits[0, at:at + len(e.ids)], alone, atol=1e-5, rtol=1e-4)
        at += len(e.ids)
    some = packed.answer
    torch.testing.assert_close(model(input_ids=packed.ids, attention_mask=packed.mask, position_ids=packed.positions,
                                     logits_at=some).logits, logits[some])
    loss = mdlm_loss(model, packed.ids, packed.mask, packed.answer, tokenizer.mask_token_id,
                     torch.Generator().manual_seed(0), positions=packed.positions, doc=packed.doc)
    # the same draws by hand, one example at a time: CE on its masked tokens / p / its answer length, mean over examples
    gen = torch.Generator().manual_seed(0)
    T = packed.ids.shape[1]
    p = ((1 - 1e-3) * torch.rand(T, generator=gen) + 1e-3)[packed.doc[0].clamp(min=0)]
    masked = packed.answer[0] & (torch.rand(1, T, generator=gen)[0] < p)
    full = model(input_ids=packed.ids.masked_fill(masked[None], tokenizer.mask_token_id), attention_mask=packed.mask,
                 position_ids=packed.positions).logits[0]
    if shift:  # Dream's convention: output i-1 scores token i
        full = torch.cat([full[:1], full[:-1]])
    ce = torch.nn.functional.cross_entropy(full, packed.ids[0], reduction="none")
    per_example = [(ce * masked / p)[packed.doc[0] == d].sum() / packed.answer[0][packed.doc[0] == d].sum()
                   for d in range(3)]
    torch.testing.assert_close(loss, sum(per_example) / 3)
    with pytest.raises(ValueError, match="position_ids"):
        model(input_ids=packed.ids, attention_mask=packed.mask)


@pytest.mark.parametrize("objective", ["ar", "mdlm"])
def test_packed_bf16_training_lowers_the_loss(tokenizer, objective, monkeypatch):
    import dataclasses

    monkeypatch.setattr("fastdecode.train.loop.cpu_bf16_is_fast", lambda: True)  # the bf16 path on every CPU
    recipe = dataclasses.replace(TINY, objective=objective, pack_len=128, bf16=True, steps=40)
    _, log = train(recipe, tokenizer, seed=0)
    first, last = sum(r["loss"] for r in log[:3]) / 3, sum(r["loss"] for r in log[-5:]) / 5
    assert last < first - 0.5


def test_bf16_recipe_trains_in_float32_where_the_cpu_emulates_bf16(tokenizer, monkeypatch):
    import dataclasses

    monkeypatch.setattr("fastdecode.train.loop.cpu_bf16_is_fast", lambda: False)
    recipe = dataclasses.replace(TINY, pack_len=128, steps=3)
    _, with_flag = train(dataclasses.replace(recipe, bf16=True), tokenizer, seed=0)
    _, without = train(dataclasses.replace(recipe, bf16=False), tokenizer, seed=0)
    assert [r["loss"] for r in with_flag] == [r["loss"] for r in without]
    monkeypatch.setattr("fastdecode.train.loop.cpu_bf16_is_fast", lambda: True)
    _, in_bf16 = train(dataclasses.replace(recipe, bf16=True), tokenizer, seed=0)
    assert [r["loss"] for r in in_bf16] != [r["loss"] for r in without]  # the flag does switch bf16 on where fast


def test_objectives_are_looked_up_by_name_with_a_clear_error(tokenizer):
    import dataclasses

    from fastdecode.errors import ParameterError
    from fastdecode.train.objectives import OBJECTIVES, Objective, objective

    # dparallel: certainty forcing of a masked-diffusion model (train/objectives/dparallel.py)
    assert set(OBJECTIVES) == {"ar", "mdlm", "dparallel"} and all(isinstance(o, Objective) for o in OBJECTIVES.values())
    assert objective("ar").causal and not objective("mdlm").causal
    with pytest.raises(ParameterError, match="Unknown training objective 'mdml'. Did you mean 'mdlm'"):
        objective("mdml")
    with pytest.raises(ParameterError, match="Unknown training objective"):
        train(dataclasses.replace(TINY, objective="dflash"), tokenizer, seed=0)
