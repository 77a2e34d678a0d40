"""Dimple's confident decoding (`dlm.threshold(fallback="schedule")`) and ReCAP's refresh schedule (`recap=k`)."""

from __future__ import annotations

import pytest
import torch

import fastdecode
from fastdecode.diffusion.confident import EPS, schedule_count

PROMPTS = ["the quick brown fox", "def add(a, b):", "Sort this"]
GEN = 16


def dimple_count(m: int, total: int, i: int, steps: int) -> int:
    """Dimple's fallback count written out as its loop reads: the first timestep below the mask ratio, not before
    step i + 1, whose int(m (1 - s / r)) is at least 1; all masks at the last timestep."""
    times = [1 + (EPS - 1) * j / steps for j in range(steps + 1)]
    r = m / total
    j = max(min(j for j, t in enumerate(times) if t < r), i + 1)
    while j < steps and int(m * (1 - times[j] / r)) < 1:
        j += 1
    return m if j == steps else int(m * (1 - times[j] / r))


@pytest.mark.parametrize("total, steps", [(16, 16), (16, 4), (32, 8), (7, 3)])
def test_schedule_count_is_dimples_and_finishes_a_block_within_its_steps(total, steps):
    for m in range(1, total + 1):
        for i in range(steps):
            assert schedule_count(m, total, i, steps) == dimple_count(m, total, i, steps) >= 1
    left = total  # a block where nothing ever passes the threshold
    for i in range(steps):
        left -= total if i == steps - 1 else schedule_count(left, total, i, steps)
        if left <= 0:
            break
    assert left <= 0


def test_schedule_count_catches_up_when_a_row_is_behind():
    on_time = schedule_count(16, 16, 0, 4)
    late = schedule_count(16, 16, 2, 4)  # no mask committed after two steps of four
    assert 1 <= on_time < late < 16


def test_confident_fallback_commits_the_schedule_count_of_the_best_masks(diffusion):
    """With a threshold nothing reaches, every step commits the schedule's count, the last step of a block all."""
    r = fastdecode.generate(diffusion, PROMPTS[0], "dlm.threshold", max_new_tokens=GEN, block_length=8,
                            threshold=1.0, fallback="schedule", block_steps=3, trace=True)
    counts = [len(e.tokens[0]) for e in r.trace]
    expected, t, left = [], 0, 8
    for _ in counts:
        want = left if t == 2 else schedule_count(left, 8, t, 3)
        expected.append(want)
        left, t = (8, 0) if left == want else (left - want, t + 1)
    assert counts == expected and r.stats.forwards <= 2 * 3
    plain = fastdecode.generate(diffusion, PROMPTS[0], "dlm.threshold", max_new_tokens=GEN, block_length=8,
                                threshold=1.0, trace=True)
    assert all(len(e.tokens[0]) == 1 for e in plain.trace)  # Fast-dLLM's fallback: the best one


def test_confident_fallback_keeps_what_passes(diffusion):
    """At a threshold every mask passes, both fallbacks commit the whole block at once."""
    for fallback in ("top1", "schedule"):
        r = fastdecode.generate(diffusion, PROMPTS[1], "dlm.threshold", max_new_tokens=GEN, block_length=8,
                                threshold=0.0, fallback=fallback, trace=True)
        assert r.stats.forwards == 2


@pytest.mark.parametrize("params, words", [
    (dict(block_steps=4), "fallback='schedule'"),
    (dict(fallback="schedule", block_steps=0), "block_steps"),
    (dict(fallback="dimple"), "fallback"),
])
def test_confident_parameters_are_refused_with_the_rule(diffusion, params, words):
    with pytest.raises(fastdecode.ParameterError, match=words):
        fastdecode.generate(diffusion, "the", "dlm.threshold", max_new_tokens=GEN, **params)


def full_forwards(model, monkeypatch) -> list[bool]:
    """Per forward_columns call, whether it was a full forward."""
    calls: list[bool] = []
    real = model.forward_columns

    def wrapped(canvas, attention, columns, kv, **kw):
        calls.append(columns is None)
        return real(canvas, attention, columns, kv, **kw)

    monkeypatch.setattr(model, "forward_columns", wrapped)
    return calls


@pytest.mark.parametrize("cache", ["dual", "suffix", "prefix", "delayed"])
@pytest.mark.parametrize("cheap, warmup", [(1, 0), (2, 3), (3, 1)])
def test_recap_runs_warmup_full_steps_then_one_full_per_k_cheap(diffusion, monkeypatch, cache, cheap, warmup):
    calls = full_forwards(diffusion, monkeypatch)
    r = fastdecode.generate(diffusion, PROMPTS[0], "dlm.baseline", max_new_tokens=GEN, block_length=4, cache=cache,
                            recap=cheap, recap_warmup=warmup)
    expected, last = [], None
    for step in range(r.stats.forwards):  # block changes (every 4 steps) refresh nothing
        full = step < warmup or last is None or step - last > cheap
        last = step if full else last
        expected.append(full)
    assert calls == expected


@pytest.mark.parametrize("name", ["dlm.baseline", "dlm.threshold", "dlm.dcd", "dlm.credit"])
def test_recap_with_every_step_in_warmup_is_the_uncached_result(diffusion, name):
    params = {p for p, _ in fastdecode.get_method(name).params()}
    extra = {"block_length": 8} if "block_length" in params else {}
    plain = fastdecode.generate(diffusion, PROMPTS, name, max_new_tokens=GEN, **extra)
    warm = fastdecode.generate(diffusion, PROMPTS, name, max_new_tokens=GEN, cache="dual", recap=1,
                               recap_warmup=GEN, **extra)
    assert [r.token_ids for r in warm] == [r.token_ids for r in plain]


def test_recap_batched_equals_one_by_one(diffusion):
    kw = dict(max_new_tokens=GEN, block_length=8, cache="dual", recap=2, recap_warmup=1)
    batched = fastdecode.generate(diffusion, PROMPTS, "dlm.threshold", **kw)
    assert [r.token_ids for r in batched] == [fastdecode.generate(diffusion, p, "dlm.threshold", **kw).token_ids
                                              for p in PROMPTS]


@pytest.mark.parametrize("name, params, words", [
    ("dlm.threshold", dict(recap=1), "must be a cache"),
    ("dlm.threshold", dict(recap=0, cache="dual"), "recap"),
    ("dlm.threshold", dict(recap=1, cache="dual", cache_refresh=2), "cache_refresh"),
    ("dlm.threshold", dict(recap_warmup=2), "recap_warmup"),
    ("dlm.freedave", dict(recap=1, cache="dual"), "recap"),
])
def test_recap_parameters_are_refused_with_the_rule(diffusion, name, params, words):
    with pytest.raises(fastdecode.ParameterError, match=words):
        fastdecode.generate(diffusion, "the", name, max_new_tokens=GEN, **params)


def test_recap_is_cheaper_than_the_block_refreshes_of_the_dual_cache(diffusion, monkeypatch):
    calls = full_forwards(diffusion, monkeypatch)
    fastdecode.generate(diffusion, PROMPTS[0], "dlm.baseline", max_new_tokens=GEN, block_length=2, cache="dual")
    own = sum(calls)
    calls.clear()
    fastdecode.generate(diffusion, PROMPTS[0], "dlm.baseline", max_new_tokens=GEN, block_length=2, cache="dual",
                        recap=3)
    assert sum(calls) < own and torch.tensor(calls).any()
