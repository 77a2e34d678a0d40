"""Parts of the image trainers that make a run resumable and seeded (no training runs here)."""

from __future__ import annotations

import pytest
import torch

from fastdecode.errors import ParameterError
from fastdecode.train.checkpoint import clear_checkpoint, load_checkpoint, save_checkpoint
from fastdecode.train.img_ar import ARTraining, batch_at


def test_state_round_trip_and_identity(tmp_path) -> None:
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(net.parameters(), lr=0.1)
    net(torch.randn(4, 3)).sum().backward()
    opt.step()
    save_checkpoint(tmp_path, {"model": net}, {"opt": opt}, {"seed": 1, "step": 7})
    other = torch.nn.Linear(3, 2)
    other_opt = torch.optim.AdamW(other.parameters(), lr=0.1)
    record = load_checkpoint(tmp_path, {"model": other}, {"opt": other_opt}, {"seed": 1})
    assert record is not None and record["step"] == 7
    assert torch.equal(other.weight, net.weight)
    p, q = next(iter(opt.state.values())), next(iter(other_opt.state.values()))
    assert torch.equal(p["exp_avg"], q["exp_avg"])
    with pytest.raises(ParameterError, match="another run"):
        load_checkpoint(tmp_path, {"model": other}, {"opt": other_opt}, {"seed": 2})
    clear_checkpoint(tmp_path)
    assert load_checkpoint(tmp_path, {"model": other}, {"opt": other_opt}, {"seed": 1}) is None


def test_batches_follow_seed_and_step_and_drop_classes() -> None:
    seqs = torch.cat([torch.full((1000, 1), 64 + 3), torch.randint(0, 64, (1000, 49))], dim=1)
    cfg = ARTraining(batch=512, class_dropout=0.1)
    a, b = batch_at(seqs, 5, 0, cfg, 74), batch_at(seqs, 5, 0, cfg, 74)
    assert torch.equal(a, b) and not torch.equal(a, batch_at(seqs, 6, 0, cfg, 74))
    dropped = float((a[:, 0] == 74).float().mean())
    assert 0.05 < dropped < 0.15 and set(a[:, 0].tolist()) == {67, 74}
