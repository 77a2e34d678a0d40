"""`dlm.dystruct` and the growing canvas it runs on (driver.py `Canvas.grow`, cache.py `Forwarder.grow`).

The growth itself must be invisible: on a model whose columns never see the columns after them (a causal toy), a
policy that grows the canvas ahead of its blocks commits exactly what it commits on the whole canvas, step by
step, while every forward is narrower. The length inference is checked on a scripted model that, like the zoo's
dlm-small, predicts the answer's EOS only once the canvas can hold the answer.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from test_dlm_eotp import Causal, sharpened, widths

import fastdecode
from fastdecode.diffusion.cache import Forwarder
from fastdecode.diffusion.driver import Canvas, denoise
from fastdecode.diffusion.policies.threshold import Threshold, ThresholdConfig
from fastdecode.engine import encode_batch

PROMPTS = ["the quick brown fox", "def add(a, b):", "Sort this"]
BLOCK = 4


class GrowingThreshold(Threshold):
    """dlm.threshold's blocks on a canvas that starts one block long and grows by a block after every step: it
    always holds the current block whole (block b is reached at step >= b, when the canvas has >= b + 2 blocks)."""

    def start(self, cap: int) -> int:
        return BLOCK

    def grow(self, step, gen, size):
        return size + BLOCK


def run(model, policy, prompts, **params):
    cfg = ThresholdConfig(max_new_tokens=24, block_length=BLOCK, **params)
    batch = encode_batch(model, prompts, cfg.max_new_tokens)
    return [e.tokens for e in denoise(model, batch, cfg, policy(model.mask_token_id, cfg), None)]


def test_growing_the_canvas_changes_no_committed_token(diffusion_dir):
    model = sharpened(diffusion_dir, causal=True)
    plain = run(model, Threshold, PROMPTS)
    calls: list[int] = []
    widths(model, calls)
    grown = run(model, GrowingThreshold, PROMPTS)
    assert grown == plain  # every step commits the same positions with the same tokens
    P = calls[0] - BLOCK
    assert calls[0] == P + BLOCK and calls == sorted(calls) and max(calls) <= P + 24
    assert len(set(calls)) > 2  # the canvas really grew, step by step


def test_canvas_grow_appends_masks_and_keeps_the_born_columns(diffusion_dir):
    model = fastdecode.load(diffusion_dir)
    batch = encode_batch(model, ["ab", "abc"], 16)
    canvas = Canvas(model, batch, 16, start=4)
    dev = model.device
    rows = torch.arange(2, device=dev)
    canvas.x[0, canvas.P] = 7
    before = canvas.x.clone()
    grew = canvas.grow(rows, torch.tensor([8, 2], device=dev))  # row 1 asks for less: a canvas never shrinks
    assert grew.tolist() == [0] and canvas.size.tolist() == [8, 4]
    assert torch.equal(canvas.x, before)  # the unborn columns were masks already: growing writes nothing
    assert canvas.grow(rows, torch.tensor([99, 99], device=dev)).tolist() == [0, 1] and canvas.size.tolist() == [16, 16]
    x, attention = canvas.visible(rows, torch.tensor([1, 1], device=dev))
    assert x.shape[1] == canvas.P + 16 and bool(attention[:, canvas.P:].all())


def test_a_grown_row_is_refreshed_and_the_others_keep_their_cache(diffusion_dir):
    model = fastdecode.load(diffusion_dir)
    cfg = ThresholdConfig(max_new_tokens=16, cache="dual")
    forward = Forwarder(model, cfg, 2, "dlm.threshold")
    dev = model.device
    x = torch.full((2, 10), model.mask_token_id, device=dev)
    attention = torch.ones(2, 10, dtype=torch.long, device=dev)
    lo, hi = torch.tensor([4, 4], device=dev), torch.tensor([6, 6], device=dev)
    z = torch.zeros(2, dtype=torch.long, device=dev)
    forward(x, attention, torch.arange(2, device=dev), lo, hi, z, z)
    forward.keep()
    forward.grow(torch.tensor([1], device=dev))
    assert forward.has_cache.tolist() == [True, False]
    wide = torch.full((2, 14), model.mask_token_id, device=dev)
    att = torch.ones(2, 14, dtype=torch.long, device=dev)
    att[0, 10:] = 0  # row 0 did not grow: the appended columns are hidden from it
    out = forward(wide, att, torch.arange(2, device=dev), lo, hi, z, z + 1)
    forward.keep()
    assert out.shape[:2] == (2, 2) and forward.kv[0][0].shape[2] == 14 and bool(forward.has_cache.all())


class Scripted(torch.nn.Module):
    """A model that writes tokens 10, 11, ... then EOS at `length`, as dlm-small does: while the canvas (the
    columns the attention mask shows after the prompt) is too short to hold the answer, it predicts content
    everywhere and no EOS."""

    def __init__(self, inner: torch.nn.Module, prompt: int, length: int) -> None:
        super().__init__()
        self.inner, self.config, self.P, self.length = inner, inner.config, prompt, length

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_):
        B, L = input_ids.shape
        V, dev = self.config.vocab_size, input_ids.device
        shown = (attention_mask[:, self.P:].sum(-1) if attention_mask is not None
                 else torch.full((B,), L - self.P, device=dev))
        j = torch.arange(L, device=dev) - self.P  # [L] generated offset of each column
        want = torch.where(j[None, :] < self.length, 10 + j[None, :].clamp(min=0) % 40, 1).expand(B, L)
        fits = (shown >= self.length + 2)[:, None]  # room for the EOS and one pad
        want = torch.where(fits, want, 10 + j[None, :].clamp(min=0) % 40)
        logits = torch.zeros(B, L, V, device=dev).scatter_(-1, want[..., None], 20.0)
        return SimpleNamespace(logits=logits)


@pytest.mark.parametrize("eotp", [True, False])
def test_dystruct_grows_until_the_answer_fits_and_stops_at_its_eos(diffusion_dir, eotp):
    model = fastdecode.load(diffusion_dir)
    P = len(encode_batch(model, "Sort this", 8).input_ids[0])
    model.model = Scripted(model.model, P, length=13)
    calls: list[int] = []
    widths(model, calls)
    r = fastdecode.generate(model, "Sort this", "dlm.dystruct", max_new_tokens=64, window=4, expand=4, eotp=eotp)
    assert r.token_ids == [10 + i for i in range(13)] + [1] and r.stats.finish_reason == "eos"
    assert calls[0] == P + 4 and max(calls) <= P + 13 + 2 + 4  # never much past the answer
    assert r.stats.forwards < 14  # the growth steps and a few parallel ones, fewer than one token per step
    capped = fastdecode.generate(model, "Sort this", "dlm.dystruct", max_new_tokens=8, window=4, expand=4, eotp=eotp)
    assert capped.token_ids == [10 + i for i in range(8)] and capped.stats.finish_reason == "length"


@pytest.mark.parametrize("cache", ["none", "dual", "window", "delayed"])
def test_dystruct_batched_equals_one_by_one(diffusion_dir, cache):
    """Rows grow at different steps; a row that did not grow never reads the columns appended for another."""
    model = sharpened(diffusion_dir)
    kw = dict(max_new_tokens=24, window=4, expand=4, cache=cache)
    batched = fastdecode.generate(model, PROMPTS, "dlm.dystruct", **kw)
    for prompt, r in zip(PROMPTS, batched, strict=True):
        single = fastdecode.generate(model, prompt, "dlm.dystruct", **kw)
        assert r.token_ids == single.token_ids and r.stats.forwards == single.stats.forwards


def test_dystruct_with_a_cache_refreshed_every_step_is_the_uncached_run(diffusion_dir):
    model = sharpened(diffusion_dir)
    kw = dict(max_new_tokens=24, window=4, expand=4)
    plain = fastdecode.generate(model, PROMPTS, "dlm.dystruct", **kw)
    for cache in ("prefix", "dual", "suffix", "delayed", "window"):
        every = fastdecode.generate(model, PROMPTS, "dlm.dystruct", cache=cache, cache_refresh=1, **kw)
        assert [r.token_ids for r in every] == [r.token_ids for r in plain], cache


def test_dystruct_refuses_bad_structure_parameters(diffusion_dir):
    model = fastdecode.load(diffusion_dir)
    for bad, word in [(dict(window=0), "window"), (dict(gamma=1.0), "gamma"), (dict(sigma=0.0), "sigma"),
                      (dict(max_block=0), "max_block"), (dict(expand=0), "expand")]:
        with pytest.raises(fastdecode.ParameterError, match=word):
            fastdecode.generate(model, "the", "dlm.dystruct", max_new_tokens=8, **bad)


def test_causal_toy_is_what_the_growth_test_needs(diffusion_dir):
    """The growth test's premise: on the causal toy a column's logits ignore every later column."""
    model = sharpened(diffusion_dir, causal=True)
    assert isinstance(model.model, Causal)
    x = torch.randint(4, 50, (1, 12)).to(model.device)
    short = model.forward(x[:, :8])
    long = model.forward(x)
    assert torch.allclose(short, long[:, :8], atol=1e-5)
