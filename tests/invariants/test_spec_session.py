"""`SpecSession`: speculative rows that join a running batch between steps (their prompt fed in the next
verification forward, beside the other rows' drafts) and leave it, get exactly their own ar.greedy tokens (fp32,
CPU), whatever the other rows do; a slot a finished row left is taken by the next joiner."""

from __future__ import annotations

import pytest
import torch
from session_driving import drive

import fastdecode
from fastdecode.config import build_config
from fastdecode.engine import encode_batch
from fastdecode.registry import RunContext
from fastdecode.speculative.driver import SpecSession

PROMPTS = ["the quick brown fox", "def add(a, b):", "Sort this", "0123456789 ABC abc the lazy dog jumps", "Q: x"]
BUDGETS = [30, 12, 24, 18, 26]


def _session(model, name: str, prompt: str, n: int, draft=None) -> SpecSession:
    spec = fastdecode.get_method(name)
    cfg = build_config(spec.config, {"max_new_tokens": n}, name)
    session = spec.driver(model, encode_batch(model, [prompt], n), cfg, RunContext(draft=draft))
    assert isinstance(session, SpecSession) and session.joinable
    return session


@pytest.mark.parametrize("name", ["spec.pld", "spec.suffix", "spec.draft_model", "spec.lookahead"])
def test_rows_joining_and_leaving_get_their_own_greedy_tokens(causal, name):
    draft = causal if fastdecode.get_method(name).needs_draft else None
    session = _session(causal, name, PROMPTS[0], BUDGETS[0], draft)
    session.max_slots = 3
    owner = {0: 0}  # slot -> prompt
    reused = False

    def join(i: int) -> int:  # one at a time, between steps
        nonlocal reused
        (slot,) = session.join(torch.tensor([causal.encode(PROMPTS[i])]), max_new_tokens=BUDGETS[i])
        reused |= slot in owner
        return slot

    out = drive(session, owner, [1, 2, 3, 4], lambda step, i: bool(session.room) and step % 2 == 1, join)
    assert reused and len(session.groups[0].rows) <= 3
    for i, prompt in enumerate(PROMPTS):
        ref = fastdecode.generate(causal, prompt, "ar.greedy", max_new_tokens=BUDGETS[i]).token_ids
        assert out[i][: len(ref)] == ref, i


def test_leave_ends_a_row_and_frees_its_slot(causal):
    session = _session(causal, "spec.pld", PROMPTS[0], 30)
    session.max_slots = 1
    session.step()
    assert session.room == 0
    session.leave(0)
    assert session.room == 1 and session.step() == []
    (slot,) = session.join(torch.tensor([causal.encode(PROMPTS[1])]), max_new_tokens=10)
    got = []
    while session.running:
        got += [t for s, _, t, _ in session.step() if s == slot]
    assert got == fastdecode.generate(causal, PROMPTS[1], "ar.greedy", max_new_tokens=10).token_ids
