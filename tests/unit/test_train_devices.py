"""Training code that meets a target on a GPU: a head's loss moves the loop's CPU batch to the head's device, and
DD2 runs the teacher where the teacher is. (The suite on a GPU, FASTDECODE_TEST_DEVICE=cuda, runs the real thing;
these check the routing on the CPU, where a forgotten move would otherwise go unnoticed.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fastdecode.train.data import Example
from fastdecode.train.dd2 import teacher_logp
from fastdecode.train.heads import target_batch
from fastdecode.train.objectives import TargetBatch, head_objective
from fastdecode.train.objectives.base import head_device

KINDS = ["eagle3", "hydra", "medusa"]


def test_a_target_batch_moves_whole():
    batch = TargetBatch(torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.bool),
                        torch.ones(1, 3, dtype=torch.bool), torch.zeros(1, 3, 4), (torch.zeros(1, 3, 4),) * 2,
                        torch.zeros(1, 3, 5))
    moved = batch.to(torch.device("meta"))
    tensors = [moved.ids, moved.attention, moved.answer, moved.hidden, *moved.layers, moved.logits]
    assert {t.device.type for t in tensors} == {"meta"}
    assert [t.shape for t in tensors] == [t.shape for t in (batch.ids, batch.attention, batch.answer, batch.hidden,
                                                             *batch.layers, batch.logits)]


@pytest.mark.parametrize("kind", KINDS)
def test_a_head_loss_runs_where_the_head_is(causal, kind, monkeypatch):
    """The loop builds the batch on the CPU (`target_batch`); the loss asks for it on the head's device."""
    goal = head_objective(kind)
    options = {"token_counts": torch.ones(causal.vocab_size), "ttt": 2} if kind == "eagle3" else {}
    head = goal.build_head(causal, options).to(causal.device).float().train()
    prompt = causal.encode("the quick brown fox")
    example = Example(prompt + causal.encode(" jumps over the lazy dog"), len(prompt), "t")
    batch = target_batch(causal, [example], goal.target_layers(causal, options))
    assert batch.hidden.device.type == "cpu"
    asked: list[torch.device] = []
    move = TargetBatch.to

    def spy(self: TargetBatch, device: torch.device) -> TargetBatch:
        asked.append(device)
        return move(self, device)

    monkeypatch.setattr(TargetBatch, "to", spy)
    loss, _ = goal.head_loss(head, causal, batch, torch.Generator().manual_seed(0))
    assert asked and set(asked) == {head_device(head)} and loss.device == head_device(head)


def test_dd2_runs_the_teacher_on_its_device():
    """DD2 trains on the CPU; the teacher's forward gets its ids and positions on the teacher's device."""
    seen: list[tuple[str, str]] = []

    def forward(ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        seen.append((ids.device.type, positions.device.type))
        return torch.zeros(*ids.shape, 6)  # [B, n, V] (on the CPU: a meta tensor holds no values to return)

    teacher = SimpleNamespace(device=torch.device("meta"), image=SimpleNamespace(K=4), forward=forward)
    logp = teacher_logp(teacher, torch.tensor([4, 5]), torch.zeros(2, 3, dtype=torch.long))
    assert seen == [("meta", "meta")] and logp.shape == (2, 3, 4) and logp.device.type == "cpu"
