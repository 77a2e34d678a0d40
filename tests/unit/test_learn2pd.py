"""dlm.learn2pd and its filter: the features it reads, the commits it makes from them, the trajectories it is trained
on, and (where the zoo ships it) the card's claim re-measured on a few items."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
import torch

import fastdecode
from fastdecode.heads import load_head, save_head
from fastdecode.heads.filter import FilterConfig, FilterHead, History
from fastdecode.train.filter import CHECKPOINT, FilterTraining, train_filter, trajectories
from fastdecode.train.filter_card import measure_decoding

CARD = Path(str(resources.files("fastdecode") / "zoo")) / "dlm-small" / "heads" / "learn2pd" / "card.json"


def test_history_counts_how_long_a_prediction_has_stayed():
    """A position predicted 7, 7, 7 has streak 1, 2, 3 and reads its last confidence; a changed prediction restarts
    the streak; committed and padding columns read as settled (1, 1, 1, 1)."""
    h = History(1, 4, torch.device("cpu"))
    rows, cols = torch.tensor([0]), torch.tensor([[0, 1, 2]])
    inview = torch.tensor([[True, True, True]])
    masked = torch.tensor([[True, True, False]])
    conf = torch.tensor([[0.5, 0.6, float("-inf")]], dtype=torch.float64)
    feats = []
    for x in ([7, 8, 0], [7, 8, 0], [7, 9, 0]):
        feats.append(h.features(rows, cols, inview, masked, torch.tensor([x]), conf, 4))
    assert feats[0].shape == (1, 4, 4)
    streak = [f[0, :, 2].tolist() for f in feats]
    assert streak[0][:2] == [1 / 8, 1 / 8] and streak[1][:2] == [2 / 8, 2 / 8] and streak[2][:2] == [3 / 8, 1 / 8]
    assert feats[0][0, 0, 1] == 0.0 and feats[1][0, 0, 1] == pytest.approx(0.5)  # no history, then the last conf
    assert feats[2][0, 2].tolist() == [1.0] * 4 and feats[2][0, 3].tolist() == [1.0] * 4  # committed, padding


def test_a_filter_saves_and_loads_back(tmp_path):
    head = FilterHead.untrained(None, seed=3)
    save_head(head, tmp_path, dtype="bfloat16")
    back = load_head(tmp_path, device="cpu", dtype=torch.float32)
    assert isinstance(back, FilterHead) and back.config == FilterConfig()
    x = torch.rand(2, 16, 4)
    assert torch.allclose(back(x), head.to(torch.bfloat16).float()(x), atol=1e-2)


def test_a_filter_reads_the_features_its_config_names():
    """A filter of the confidence alone ignores the other features; an unknown feature is refused."""
    head = FilterHead(FilterConfig(features=("conf",)))
    x = torch.rand(3, 16, 4)
    y = x.clone()
    y[..., 1:] = torch.rand(3, 16, 3)
    assert torch.equal(head(x), head(y)) and head.hidden.in_features == 16
    with pytest.raises(ValueError, match="choose some of"):
        FilterHead(FilterConfig(features=("entropy",)))


def _fixed_filter(folder: Path, bias: float) -> str:
    """A filter that calls every position final (bias > 0) or none (bias < 0), whatever it reads."""
    head = FilterHead(FilterConfig())
    with torch.no_grad():
        for p in head.parameters():
            p.zero_()
        head.out.bias.fill_(bias)
    save_head(head, folder)
    return str(folder)


def test_learn2pd_commits_what_the_filter_calls_final(diffusion, tmp_path):
    """A filter that calls everything final commits a whole block a step (one forward per block of 4); one that
    calls nothing final leaves the driver's one most confident mask a step (one forward per token)."""
    prompt = "the quick brown"
    kw = {"max_new_tokens": 12, "block_length": 4, "eotp": False}
    every = fastdecode.generate(diffusion, prompt, "dlm.learn2pd", head=_fixed_filter(tmp_path / "all", 20.0), **kw)
    none = fastdecode.generate(diffusion, prompt, "dlm.learn2pd", head=_fixed_filter(tmp_path / "none", -20.0), **kw)
    assert every.stats.forwards <= 3 and every.stats.accepted == 4 * every.stats.forwards  # a block a forward
    assert none.stats.forwards == none.stats.accepted  # one commit per forward
    base = fastdecode.generate(diffusion, prompt, "dlm.baseline", max_new_tokens=12, block_length=4)
    assert none.token_ids == base.token_ids  # top-1 a step in blocks of 4: LLaDA's schedule with steps = tokens


def test_a_block_wider_than_the_filter_is_refused(diffusion):
    with pytest.raises(fastdecode.ParameterError, match="wider than the filter"):
        fastdecode.generate(diffusion, "the", "dlm.learn2pd", max_new_tokens=32, block_length=32)


def test_trajectories_label_the_final_tokens(diffusion):
    """Only masked positions are labelled; at a step with one mask left in view the baseline commits it with its x0,
    so that sample's label is "final"."""
    data = trajectories(diffusion, ["the quick brown", "def"], 8, 4)
    S = data["feats"].shape[0]
    assert data["feats"].shape == (S, 4, 4) and data["labels"].shape == data["masked"].shape == (S, 4)
    assert not (data["labels"] & ~data["masked"]).any()
    one = data["masked"].sum(-1) == 1
    assert one.any() and data["labels"][one].any(-1).all()
    assert set(data["item"].tolist()) == {0, 1}


@pytest.mark.skipif(not CARD.is_file(), reason="no Learn2PD filter ships beside zoo:dlm-small")
def test_the_card_claim_holds_on_a_few_items():
    """dlm.learn2pd decodes the card's first two tasks' test items again with the shipped filter: the forwards and
    tokens per item within 10 %, the accuracy the card states on those items."""
    torch.set_num_threads(1)
    card = json.loads(CARD.read_text())
    row = next(d for d in card["decoding"] if d["method"] == "dlm.learn2pd")
    model = fastdecode.load("zoo:dlm-small", device="cpu", dtype="float32")
    got = measure_decoding(model, "dlm.learn2pd", row["params"], row["per_task"], tasks=2)
    n = len(got["item_tokens"])
    claimed_tpf = sum(row["item_tokens"][:n]) / sum(row["item_forwards"][:n])
    assert got["tpf"] == pytest.approx(claimed_tpf, rel=0.1)
    assert sum(got["item_scores"]) == pytest.approx(sum(row["item_scores"][:n]), abs=1)
    assert f"{row['tpf']:.2f}" in (CARD.parent / "README.md").read_text()


def test_an_interrupted_training_resumes_to_the_same_filter(diffusion, tmp_path):
    """The filter of a run stopped after its first checkpoint and rerun equals the uninterrupted run's, tensor for
    tensor (the trajectories are kept task by task, the batches follow from the seed and the step)."""
    cfg = FilterTraining(items=2, held_out=1, batch=2, steps=20, checkpoint_every=10, eval_per_task=0,
                         tasks="lists.copy,letters.copy")
    whole, _ = train_filter(diffusion, tmp_path / "whole", cfg=cfg)

    def stop(phase: str, done: int, total: int, metrics: dict) -> None:
        if phase == "train" and done == 15:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_filter(diffusion, tmp_path / "cut", cfg=cfg, report=stop)
    assert (tmp_path / "cut" / CHECKPOINT / "state.json").is_file()
    resumed, card = train_filter(diffusion, tmp_path / "cut", cfg=cfg)
    for (name, a), (_, b) in zip(whole.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert card["params"] == sum(p.numel() for p in resumed.parameters())
    assert card["data"]["tasks"] == ["lists.copy", "letters.copy"] and 0 <= card["held_out"]["0.95"]["precision"] <= 1
