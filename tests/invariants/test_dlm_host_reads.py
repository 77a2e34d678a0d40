"""The device reads of a diffusion step (issue #30, docs/diffusion.md "Host work per step"): on a GPU every read of a
tensor's value is a synchronisation. The driver reads a step once (its commits, the masks it could commit and the
rows that finished: `driver.read_step`); the forward's width is known on the host when the blocks tile the canvas.
Counted on the CPU, where `.tolist()` and `.item()` are the reads (`fastdecode.models.host_ops.HostOps`)."""

from __future__ import annotations

import pytest

import fastdecode
from fastdecode.models.host_ops import HostOps
from fastdecode.types import StepEvent

PROMPTS = ["the quick brown fox", "def add(a, b):"]
GEN = 16


def reads(model, prompts: list[str], method: str, **params) -> list[tuple[int, int]]:
    """(step index, device reads) per `StepEvent` of one generation."""
    events = fastdecode.stream(model, prompts, method, max_new_tokens=GEN, **params)
    counts = []
    while True:
        with HostOps() as count:
            event = next(events)
        if not isinstance(event, StepEvent):
            return counts
        counts.append((event.index, count.reads))


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS])
@pytest.mark.parametrize("method", ["dlm.threshold", "dlm.localleap", "dlm.entropy_bound"])
def test_a_rule_step_reads_the_device_once(diffusion, method, prompts):
    counts = reads(diffusion, prompts, method, block_length=8)
    assert len(counts) >= 2
    assert all(n == 1 for _, n in counts), f"{method}: device reads per step {counts}"


def test_a_baseline_step_reads_twice_past_its_first(diffusion):
    """LLaDA's schedule is split again when a row enters a new block: whether any did is the second read (more,
    at the step that enters it). With one block only the first step enters one."""
    counts = reads(diffusion, PROMPTS, "dlm.baseline")
    assert len(counts) >= 3
    assert all(n == 2 for _, n in counts[1:]), f"device reads per step {counts}"


def test_a_freedave_round_reads_its_forward_and_each_plan_once(diffusion):
    """A round: one read of the states its batched forward gave, one of each live row's plan (its drafts' offsets,
    tokens and ends); the events of a round after its first read nothing. The priming forward is one more."""
    for prompts in (PROMPTS[:1], PROMPTS):
        counts = reads(diffusion, prompts, "dlm.freedave")
        rounds = {index for index, _ in counts}
        assert len(rounds) >= 2
        assert sum(n for _, n in counts) <= 1 + len(rounds) * (1 + len(prompts)), f"device reads per event {counts}"
