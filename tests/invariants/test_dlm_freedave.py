"""dlm.freedave is lossless: token for token dlm.baseline at one token per step, with fewer forwards."""

from __future__ import annotations

import pytest
import torch

import fastdecode

PROMPTS = ["the quick brown fox", "def add(a, b):", "Sort this", "0123456789 ABC abc the lazy dog jumps"]
GEN = 16


@pytest.fixture(scope="module", params=[1.0, 50.0], ids=["raw", "sharp"])
def model(request, diffusion_dir):
    m = fastdecode.load(diffusion_dir)
    with torch.no_grad():
        m.model.lm_head.weight.mul_(request.param)
    return m


@pytest.mark.parametrize("cache", ["none", "prefix", "dual", "suffix"])
@pytest.mark.parametrize("block_length", [None, 4, 8])
def test_equals_baseline_at_one_token_per_step_with_fewer_forwards(model, block_length, cache):
    kw = dict(max_new_tokens=GEN, block_length=block_length, cache=cache)
    base = fastdecode.generate(model, PROMPTS, "dlm.baseline", steps=GEN, **kw)
    fast = fastdecode.generate(model, PROMPTS, "dlm.freedave", **kw)
    assert [r.token_ids for r in fast] == [r.token_ids for r in base]
    assert all(f.stats.forwards <= b.stats.forwards for f, b in zip(fast, base, strict=True))
    assert sum(f.stats.forwards for f in fast) < sum(b.stats.forwards for b in base)


@pytest.mark.parametrize("cache, refresh", [("prefix", 3), ("dual", 2), ("dual", 1), ("suffix", 2)])
def test_stays_lossless_with_periodic_cache_refreshes(model, cache, refresh):
    kw = dict(max_new_tokens=GEN, block_length=8, cache=cache, cache_refresh=refresh)
    base = fastdecode.generate(model, PROMPTS, "dlm.baseline", **kw)
    fast = fastdecode.generate(model, PROMPTS, "dlm.freedave", **kw)
    assert [r.token_ids for r in fast] == [r.token_ids for r in base]


def test_equals_baseline_through_an_early_eos(diffusion_dir):
    model = fastdecode.load(diffusion_dir)
    free = fastdecode.generate(model, PROMPTS, "dlm.baseline", max_new_tokens=GEN, block_length=8)
    model.config.eos_token_id = [1, free[0].token_ids[5], free[2].token_ids[2]]  # rows now stop at different steps
    base = fastdecode.generate(model, PROMPTS, "dlm.baseline", max_new_tokens=GEN, block_length=8)
    fast = fastdecode.generate(model, PROMPTS, "dlm.freedave", max_new_tokens=GEN, block_length=8)
    assert [r.token_ids for r in fast] == [r.token_ids for r in base]
    assert any(r.stats.finish_reason == "eos" for r in fast)
    one = [fastdecode.generate(model, p, "dlm.freedave", max_new_tokens=GEN, block_length=8) for p in PROMPTS]
    assert [r.stats.forwards for r in one] == [r.stats.forwards for r in fast]  # each row charged what it spent


def test_one_draft_is_the_baseline_plus_one_priming_forward(diffusion):
    base = fastdecode.generate(diffusion, PROMPTS[0], "dlm.baseline", max_new_tokens=GEN)
    fast = fastdecode.generate(diffusion, PROMPTS[0], "dlm.freedave", max_new_tokens=GEN, draft_steps=1, trace=True)
    assert fast.token_ids == base.token_ids and fast.stats.forwards == base.stats.forwards
    assert [e.forwards for e in fast.trace] == [2] + [1] * (GEN - 2) + [0]  # the last commit needs no forward
