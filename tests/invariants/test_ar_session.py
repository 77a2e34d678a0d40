"""`ARSession`: rows that join a running ar batch between steps, and leave it, get exactly their own ar.greedy
tokens (fp32, CPU), whatever the other rows do; `autoregressive()` is the same session with every row at once."""

from __future__ import annotations

import copy

import pytest
import torch
from session_driving import drive

import fastdecode
from fastdecode.ar.driver import ARSession
from fastdecode.ar.greedy import GreedyConfig
from fastdecode.cache import KVCache

PROMPTS = ["the quick brown fox", "def add(a, b):", "Sort this", "0123456789 ABC abc the lazy dog jumps", "Q: x"]


def _pad(model, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[model.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def _staggered(model, cfg: GreedyConfig, slots: int, budgets: list[int]) -> dict[int, list[int]]:
    """Prompts 0 and 1 join together (left-padded), 2 after two steps, 3 and 4 one at a time whenever a slot is
    free; each row has its own token budget, so rows leave at different steps and their slots are reused."""
    ids = [model.encode(p) for p in PROMPTS]
    session = ARSession(model, cfg, slots=slots)
    owner: dict[int, int] = {}  # slot -> prompt
    for s, i in zip(session.join(*_pad(model, [ids[0], ids[1]]), max_new_tokens=budgets[0]), (0, 1), strict=True):
        owner[s] = i
    session.budget[[k for k, v in owner.items() if v == 1][0]] = budgets[1]

    def join(i: int) -> int:
        (s,) = session.join(*_pad(model, [ids[i]]), max_new_tokens=budgets[i])
        return s

    return drive(session, owner, [2, 3, 4], lambda step, i: bool(session.free) and (step >= 2 or i != 2), join)


def _check(model, cfg: GreedyConfig, slots: int) -> None:
    budgets = [12, 5, 9, 7, 10]
    out = _staggered(model, cfg, slots, budgets)
    for i, prompt in enumerate(PROMPTS):
        single = fastdecode.generate(model, prompt, "ar.greedy", max_new_tokens=budgets[i],
                                     repetition_penalty=cfg.repetition_penalty)
        assert out[i] == single.token_ids, f"prompt {i}"


@pytest.mark.parametrize("slots", [2, 3, 5])
def test_rows_joining_at_different_steps_equal_one_by_one(causal, slots):
    _check(causal, GreedyConfig(max_new_tokens=16), slots)


def test_history_of_a_joining_row_is_its_own(causal):
    _check(causal, GreedyConfig(max_new_tokens=16, repetition_penalty=1.5), 3)


def test_transformers_forward_on_the_same_cache(causal):
    plain = copy.copy(causal)
    plain.native = None  # transformers' own forward through fastdecode's attention and KV cache
    _check(plain, GreedyConfig(max_new_tokens=16), 3)


def test_zoo_ar_tiny():
    pytest.importorskip("safetensors")
    model = fastdecode.load("zoo:ar-tiny")
    _check(model, GreedyConfig(max_new_tokens=16), 3)


def test_a_row_that_leaves_frees_its_columns(causal):
    session = ARSession(causal, GreedyConfig(max_new_tokens=8), slots=2)
    a, b = session.join(*_pad(causal, [causal.encode(PROMPTS[0]), causal.encode(PROMPTS[2])]))
    session.step()
    session.step()
    session.leave(a)
    assert isinstance(session.cache, KVCache)
    assert session.cache.lengths[a] == 0 and session.free == [a] and session.running == 1
    picked = session.step()
    assert [s for s, *_ in picked] == [b]
    with pytest.raises(ValueError, match="slots free"):
        session.join(*_pad(causal, [[5, 6], [7, 8]]))
    session.leave(b)  # free slots at the end leave the forward; a join takes the lowest free slot
    assert session.size == 1 and session.running == 0 and session.cache.lengths == [0]
    assert session.join(*_pad(causal, [[5, 6], [7, 8, 9]])) == [0, 1] and session.size == 2
