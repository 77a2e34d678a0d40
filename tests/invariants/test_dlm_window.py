"""The Window-Diffusion cache (`cache="window"`): what a cheap step recomputes, and that the pruned far field never
reaches a logit between full forwards."""

from __future__ import annotations

import pytest
import torch

import fastdecode
from fastdecode.diffusion.cache import Forwarder
from fastdecode.diffusion.policies.threshold import ThresholdConfig

GEN = 16


def forwarder(model, **params) -> Forwarder:
    cfg = ThresholdConfig(max_new_tokens=GEN, block_length=4, cache="window", **params)
    return Forwarder(model, cfg, 1, "dlm.threshold")


def canvases(model) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """A prompt + GEN masks, the same with two tokens committed in the first block, and its attention."""
    prompt = torch.tensor(model.encode("the quick brown fox"))
    x = torch.cat([prompt, torch.full((GEN,), model.mask_token_id)])[None]
    later = x.clone()
    P = len(prompt)
    later[0, P : P + 2] = later[0, : 2]
    dev = model.device
    return x.to(dev), later.to(dev), torch.ones_like(x, device=dev), P


def step(fw: Forwarder, x, attention, P: int, index: int, lo: int = 0, hi: int = 4) -> torch.Tensor:
    one = lambda v: torch.tensor([v], device=x.device)  # noqa: E731
    out = fw(x, attention, one(0), one(P + lo), one(P + hi), one(lo // 4), one(index))
    fw.keep()
    return out


def test_the_far_field_never_reaches_a_logit_between_full_forwards(diffusion):
    x, later, attention, P = canvases(diffusion)
    fresh = []
    for tamper in (None, "far", "window"):
        fw = forwarder(diffusion, window_tokens=6, active_tokens=2)
        step(fw, x, attention, P, 0)  # the full forward
        assert fw.kv is not None
        if tamper is not None:
            # the masks still masked in `later` are at P+2..; with 6 in the window the far field starts at P+8
            cols = slice(P + 8, None) if tamper == "far" else slice(P + 4, P + 8)
            gen = torch.Generator().manual_seed(0)
            fw.kv = [(k.clone(), v.clone()) for k, v in fw.kv]
            for k, v in fw.kv:
                # drawn on the CPU (the same noise on every device), written where the cache lives
                k[:, :, cols] = torch.randn(k[:, :, cols].shape, generator=gen).to(k.device)
                v[:, :, cols] = torch.randn(v[:, :, cols].shape, generator=gen).to(v.device)
        fresh.append(step(fw, later, attention, P, 1))  # a cheap step
    plain, far, window = fresh
    assert torch.equal(far, plain)  # pruned: the far field's K/V are never read
    assert not torch.allclose(window, plain)  # the window's are


def test_a_cheap_step_recomputes_the_view_the_first_masks_and_the_new_tokens(diffusion, monkeypatch):
    calls = []
    real = diffusion.forward_columns

    def spy(canvas, attention, columns, kv, **kw):
        calls.append(None if columns is None else sorted(set(columns[0].tolist())))
        return real(canvas, attention, columns, kv, **kw)

    monkeypatch.setattr(diffusion, "forward_columns", spy)
    x, later, attention, P = canvases(diffusion)
    fw = forwarder(diffusion, window_tokens=6, active_tokens=3)
    step(fw, x, attention, P, 0)
    later[0, P + 9] = later[0, 0]  # a token committed out of order, past the first masks
    step(fw, later, attention, P, 1, lo=4, hi=8)
    assert calls[0] is None
    first_masks = [P + 2, P + 3, P + 4]
    new_tokens = [P, P + 1, P + 9]
    view = list(range(P + 4, P + 8))
    assert calls[1] == sorted(set(first_masks + new_tokens + view))


@pytest.mark.parametrize("name", ["dlm.baseline", "dlm.threshold", "dlm.dcd", "dlm.freedave"])
def test_window_refreshed_every_step_is_the_uncached_result_and_refreshes_every_32_steps(diffusion, monkeypatch,
                                                                                         name):
    params = {p for p, _ in fastdecode.get_method(name).params()}
    kw = dict(max_new_tokens=40) | ({"block_length": 8} if "block_length" in params else {})
    prompts = ["the quick brown fox", "def add(a, b):"]
    plain = fastdecode.generate(diffusion, prompts, name, **kw)
    every = fastdecode.generate(diffusion, prompts, name, cache="window", cache_refresh=1, **kw)
    assert [r.token_ids for r in every] == [r.token_ids for r in plain]
    if name == "dlm.freedave":
        return
    full = []
    real = diffusion.forward_columns
    monkeypatch.setattr(diffusion, "forward_columns",
                        lambda c, a, cols, kv, **k: (full.append(cols is None), real(c, a, cols, kv, **k))[1])
    r = fastdecode.generate(diffusion, prompts[0], name, cache="window", **kw)
    assert [i for i, f in enumerate(full) if f] == list(range(0, r.stats.forwards, 32))


def test_window_parameters_are_refused_with_the_rule(diffusion):
    for params, words in [(dict(window_tokens=0), "window_tokens"), (dict(active_tokens=0), "active_tokens")]:
        with pytest.raises(fastdecode.ParameterError, match=words):
            fastdecode.generate(diffusion, "the", "dlm.threshold", max_new_tokens=GEN, cache="window", **params)
