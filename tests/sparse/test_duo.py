"""sparse.duo with DuoAttention's trained gates: the trainer (a tiny random model, a few steps), the head choice, the
sizes, and the shipped zoo:ar-long gates' card claim re-measured on a few of its items."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import fastdecode
from fastdecode.attention import make_selector
from fastdecode.bench.calibration import longctx_prompts
from fastdecode.errors import IncompatibleMethodError
from fastdecode.heads import load_head, save_head
from fastdecode.heads.duo import DuoGates
from fastdecode.sparse.calibration import calibrate
from fastdecode.sparse.duo import DuoConfig, top_share
from fastdecode.train.duo import DuoTraining, streaming_mask, train_gates
from fastdecode.train.duo_card import passkey_scores, pattern_error, splits

GATES = Path(str(resources.files("fastdecode") / "zoo")) / "ar-long" / "heads" / "duo"
TINY = DuoTraining(steps=3, lr=0.2, sinks=2, window=8, context_min=70, context_max=90, lengths=2,
                   checkpoint_every=1)


@pytest.fixture(scope="module")
def tiny(tokenizer):
    """2 layers, 4 query heads over 2 key/value heads, 512 positions, random weights."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=False)
    m = fastdecode.CausalLM(LlamaForCausalLM(cfg).eval(), tokenizer, name="tiny-duo")
    m._sparse_calibration = calibrate(m, longctx_prompts(items=2, context=96), context=96, tail=8)
    return m


class Stop(Exception):
    pass


def test_the_trainer_moves_the_gates_and_resumes_to_the_same_gates(tiny, tmp_path):
    torch.set_num_threads(1)
    whole, card = train_gates(tiny, tmp_path / "whole", seed=0, cfg=TINY)
    gates = whole.gates()
    assert gates.shape == (2, 2) and bool((gates >= 0).all() and (gates <= 1).all())
    assert bool((gates < 1).all())  # every gate moved from its start, 1.0
    assert card["gates"] == [[round(float(a), 4) for a in row] for row in gates]

    def interrupt(step, total, metrics):
        if step == 3:
            raise Stop

    with pytest.raises(Stop):
        train_gates(tiny, tmp_path / "cut", seed=0, cfg=TINY, progress=interrupt)
    assert json.loads((tmp_path / "cut" / "checkpoint" / "state.json").read_text())["step"] == 2
    resumed, _ = train_gates(tiny, tmp_path / "cut", seed=0, cfg=TINY)
    assert torch.equal(resumed.gates(), gates)
    assert len((tmp_path / "cut" / "train_log.jsonl").read_text().splitlines()) == 3
    saved = load_head(tmp_path / "whole", device="cpu")
    assert saved.alpha.dtype == torch.bfloat16


def test_the_streaming_pattern_is_sinks_and_a_window():
    m = streaming_mask(6, sinks=1, window=2)
    assert m[5].tolist() == [True, False, False, False, True, True]
    assert m[1].tolist() == [True, True, False, False, False, False]


def test_retrieval_heads_are_the_top_share_by_gate_value():
    gates = torch.tensor([[0.9, 0.1], [0.5, 0.7]])
    assert top_share(gates, 0.5).tolist() == [[True, False], [False, True]]
    assert top_share(gates, 0.0).sum() == 0 and top_share(gates, 1.0).all()


def test_sizes_are_the_authors_where_the_budget_holds_them():
    cfg = DuoConfig()
    assert (cfg.budget, cfg.sinks, cfg.budget - cfg.sinks) == (320, 64, 256)
    small = DuoConfig(budget=64)
    assert (small.sinks, small.budget - small.sinks) == (12, 52)
    assert DuoConfig(budget=1024, sinks=128).sinks == 128


def test_a_model_without_gates_falls_back_to_the_far_mass_ranking(tiny, tmp_path):
    sel = make_selector("duo:budget=24", tiny)
    sel.heads()
    assert sel.state_static["source"] == "far_mass"
    # gates given as a folder are used
    gates = DuoGates.for_target(tiny)
    with torch.no_grad():
        gates.alpha.copy_(torch.tensor([[0.0, 1.0], [0.2, 0.1]]))
    save_head(gates, tmp_path / "g", dtype="bfloat16")
    sel = make_selector(f"duo:budget=24,retrieval=0.25,gates={tmp_path / 'g'}", tiny)
    assert sel.heads().tolist() == [[False, True], [False, False]] and sel.state_static["source"] == "gates"


def test_gates_of_other_weights_are_refused_when_named(tiny, tmp_path):
    gates = DuoGates.for_target(tiny, weights_sha256="0" * 64)
    save_head(gates, tmp_path / "g")
    tiny._weights_sha256 = "1" * 64
    try:
        with pytest.raises(IncompatibleMethodError, match="other weights"):
            make_selector(f"duo:budget=24,gates={tmp_path / 'g'}", tiny).heads()
    finally:
        del tiny._weights_sha256


@pytest.mark.skipif(not (GATES / "card.json").is_file(), reason="zoo:ar-long ships no DuoAttention gates")
def test_the_shipped_gates_keep_their_card_claim_on_a_few_items():
    torch.set_num_threads(1)
    card = json.loads((GATES / "card.json").read_text())
    model = fastdecode.load("zoo:ar-long", device="cpu", dtype="float32")
    gates = load_head(GATES, device="cpu", dtype=torch.float32)
    assert isinstance(gates, DuoGates) and gates.fits(model), "the gates were trained on other ar-long weights: " \
        "retrain them (the command in their README.md)"
    assert gates.gates().flatten().tolist() == pytest.approx(sum(card["gates"], []), abs=1e-3)
    # the claim: the gates' split is closer to dense attention than the far-mass ranking's, at each context
    error = {(r["split"], r["context"]): r["error"] for r in card["pattern_error"]}
    assert all(error["gates", c] < error["far_mass", c] < error["all streaming", c] for c in ("1k", "2k"))
    sel = make_selector("duo", model)
    sel.heads()
    assert sel.state_static["source"] == "gates"  # the shipped gates, found with no flag
    few = 2
    split = splits(model, str(GATES))
    for row in card["pattern_error"]:
        assert row["dense_heads"] == split[row["split"]].int().tolist()
        if row["context"] == "1k" and row["split"] != "all streaming":
            got = pattern_error(model, split[row["split"]], "1k", 1)
            assert got == pytest.approx(row["item_errors"][:1], rel=1e-3, abs=1e-6), row["split"]
    for row in card["decoding"]:
        if row["context"] != "1k" or row["method"] != "sparse.duo":
            continue
        got = passkey_scores(model, row["method"], row["params"], row["context"], few)
        assert got == row["item_scores"][:few], row["label"]


def test_train_duo_writes_the_gates_and_their_card(cli_main, tmp_path, save_causal_model, tokenizer):
    model = save_causal_model(tmp_path / "m", tokenizer, max_position_embeddings=256)
    out = tmp_path / "gates"
    args = ["train", "duo", "--target", str(model), "--out", str(out), "--steps", "2", "--eval-items", "0",
            "--set", "context_min=60", "--set", "context_max=80", "--set", "sinks=2", "--set", "window=8"]
    assert cli_main(*args) == 0
    assert (out / "model.safetensors").is_file() and not (out / "checkpoint").exists()
    card = json.loads((out / "card.json").read_text())
    assert card["command"].startswith("fastdecode train duo --target") and len(card["gates"]) == 2
    assert "| layer |" in (out / "README.md").read_text()


def test_train_duo_refuses_an_unknown_setting(cli_main, capsys, tmp_path):
    assert cli_main("train", "duo", "--out", str(tmp_path), "--set", "lrate=1") == 2
    err = capsys.readouterr().err
    assert "not a setting of the gates' training" in err and "lr" in err
