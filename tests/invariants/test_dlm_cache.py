"""Caches for masked diffusion: the model's partial forward, refresh-every-step exactness, what each cache
recomputes."""

from __future__ import annotations

import pytest
import torch

import fastdecode
from fastdecode.models.diffusion import MaskedDiffusionLM

PROMPTS = ["the quick brown fox", "def add(a, b):", "Sort this"]
GEN = 16
METHODS = [m.name for m in fastdecode.methods("diffusion")]


@pytest.fixture(scope="module")
def sharp(diffusion_dir):
    model = fastdecode.load(diffusion_dir)
    with torch.no_grad():
        model.model.lm_head.weight.mul_(50.0)
    return model


def kw(name: str, **extra) -> dict:
    params = {p for p, _ in fastdecode.get_method(name).params()}
    return {k: v for k, v in dict(max_new_tokens=GEN, block_length=8, **extra).items() if k in params}


def padded_canvas(model, seed: int, row: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two random 12-column canvases, `row` left-padded by `pad` columns."""
    torch.manual_seed(seed)
    canvas = torch.randint(4, model.vocab_size, (2, 12))  # drawn on the CPU: the same canvases on every device
    attention = torch.ones(2, 12, dtype=torch.long)
    attention[row, :pad] = 0
    return canvas.to(model.device), attention.to(model.device)


@pytest.mark.parametrize("shifted", [False, True])
def test_partial_forward_with_exact_cached_kv_equals_the_full_forward(diffusion, shifted):
    model = MaskedDiffusionLM(diffusion.model, mask_token_id=3, shifted=shifted)
    canvas, attention = padded_canvas(model, seed=0, row=1, pad=4)
    full = model.forward(canvas, attention)
    logits, kv = model.forward_columns(canvas, attention, None, None)
    assert torch.equal(logits, full)  # the caching full forward is the plain one
    cols = torch.tensor([[5, 6, 7, 11], [4, 9, 9, 10]], device=model.device)  # duplicates are allowed (padding)
    part, kv2 = model.forward_columns(canvas, attention, cols, kv)
    expected = full.gather(1, cols[..., None].expand(-1, -1, full.shape[-1]))
    torch.testing.assert_close(part, expected, rtol=1e-5, atol=1e-5)
    for (k, v), (k2, v2) in zip(kv, kv2, strict=True):
        torch.testing.assert_close(k2, k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v2, v, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shifted", [False, True])
def test_logits_at_some_columns_equal_those_of_the_full_forward(diffusion, shifted):
    """`at` runs the output head on the wanted columns only: the same logits, of the full and the cached forward."""
    model = MaskedDiffusionLM(diffusion.model, mask_token_id=3, shifted=shifted)
    canvas, attention = padded_canvas(model, seed=1, row=0, pad=3)
    full = model.forward(canvas, attention)
    at = torch.tensor([[0, 6, 7, 7], [8, 9, 10, 11]], device=model.device)
    want = full.gather(1, at[..., None].expand(-1, -1, full.shape[-1]))
    torch.testing.assert_close(model.forward(canvas, attention, at=at), want, rtol=1e-5, atol=1e-5)
    logits, kv = model.forward_columns(canvas, attention, None, None, at=at)
    torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)
    part, _ = model.forward_columns(canvas, attention, torch.tensor([[6, 7], [9, 11]], device=model.device), kv,
                                  at=at)
    torch.testing.assert_close(part, want, rtol=1e-5, atol=1e-5)


def test_a_shifted_model_recomputes_each_needed_column_once(diffusion, monkeypatch):
    """Scoring columns 6..9 of a shifted model needs outputs 5..8 and fresh K/V of 6..9: columns 5..9, once each."""
    model = MaskedDiffusionLM(diffusion.model, mask_token_id=3, shifted=True)
    canvas = torch.randint(4, model.vocab_size, (1, 12)).to(model.device)
    attention = torch.ones(1, 12, dtype=torch.long, device=model.device)
    _, kv = model.forward_columns(canvas, attention, None, None)
    seen = []
    real = model.model.forward

    def wrapped(*args, **kw):
        seen.append(kw["query_index"].tolist())
        return real(*args, **kw)

    monkeypatch.setattr(model.model, "forward", wrapped)
    cols = torch.tensor([[6, 7, 8, 9]], device=model.device)
    model.forward_columns(canvas, attention, cols, kv)
    assert seen == [[[5, 6, 7, 8, 9]]]


def test_a_stale_cache_reads_old_kv_for_columns_it_does_not_recompute(diffusion):
    canvas = torch.randint(4, diffusion.vocab_size, (1, 10)).to(diffusion.device)
    attention = torch.ones(1, 10, dtype=torch.long, device=diffusion.device)
    _, kv = diffusion.forward_columns(canvas, attention, None, None)
    changed = canvas.clone()
    changed[0, 2] = 3  # column 2 changes but is not recomputed: its old K/V stay in use
    cols = torch.tensor([[6, 7]], device=diffusion.device)
    stale, _ = diffusion.forward_columns(changed, attention, cols, kv)
    fresh = diffusion.forward(changed, attention)[:, 6:8]
    unchanged = diffusion.forward(canvas, attention)[:, 6:8]
    torch.testing.assert_close(stale, unchanged, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(stale, fresh)


@pytest.mark.parametrize("cache", ["prefix", "dual", "suffix", "delayed", "window"])
@pytest.mark.parametrize("name", METHODS)
def test_a_cache_refreshed_every_step_gives_exactly_the_uncached_result(sharp, name, cache):
    if name == "dlm.freedave" and cache == "delayed":  # drafts would read K/V of tokens not yet verified
        with pytest.raises(fastdecode.FastDecodeError, match="delayed"):
            fastdecode.generate(sharp, PROMPTS, name, **kw(name, cache=cache, cache_refresh=1))
        return
    plain = fastdecode.generate(sharp, PROMPTS, name, **kw(name))
    cached = fastdecode.generate(sharp, PROMPTS, name, **kw(name, cache=cache, cache_refresh=1))
    assert [r.token_ids for r in cached] == [r.token_ids for r in plain]
    assert [r.stats.forwards for r in cached] == [r.stats.forwards for r in plain]


@pytest.mark.parametrize("cache", ["prefix", "dual", "suffix", "delayed", "window"])
@pytest.mark.parametrize("name", ["dlm.baseline", "dlm.threshold", "dlm.dcd", "dlm.ccd"])
def test_cached_runs_batched_equal_one_by_one(sharp, name, cache):
    batched = fastdecode.generate(sharp, PROMPTS, name, **kw(name, cache=cache))
    singles = [fastdecode.generate(sharp, p, name, **kw(name, cache=cache)) for p in PROMPTS]
    assert [r.token_ids for r in batched] == [r.token_ids for r in singles]


def spy(model, monkeypatch) -> list:
    """Record each forward_columns call's recomputed columns per row (None for a full forward)."""
    calls = []
    real = model.forward_columns

    def wrapped(canvas, attention, columns, kv, **kw):
        calls.append(None if columns is None else [sorted(set(row)) for row in columns.tolist()])
        return real(canvas, attention, columns, kv, **kw)

    monkeypatch.setattr(model, "forward_columns", wrapped)
    return calls


def test_dual_cache_recomputes_the_block_and_refreshes_at_block_boundaries(diffusion, monkeypatch):
    calls = spy(diffusion, monkeypatch)
    r = fastdecode.generate(diffusion, PROMPTS[0], "dlm.baseline", max_new_tokens=GEN, block_length=4, cache="dual",
                            trace=True)
    P = len(r.prompt_ids)
    assert len(calls) == r.stats.forwards == GEN
    for step, cols in enumerate(calls):
        block = step // 4  # one token per step, 4 steps per block
        if step % 4 == 0:
            assert cols is None  # a new block: one full forward, whose logits also serve the step
        else:
            assert cols == [list(range(P + 4 * block, P + 4 * block + 4))]


def test_prefix_cache_recomputes_from_the_block_to_the_end(diffusion, monkeypatch):
    calls = spy(diffusion, monkeypatch)
    r = fastdecode.generate(diffusion, PROMPTS[0], "dlm.baseline", max_new_tokens=GEN, block_length=8, cache="prefix")
    P, T = len(r.prompt_ids), len(r.prompt_ids) + GEN
    assert calls[0] is None and calls[8] is None
    assert calls[1] == [list(range(P, T))] and calls[9] == [list(range(P + 8, T))]


def test_suffix_cache_recomputes_everything_up_to_the_end_of_the_block(diffusion, monkeypatch):
    calls = spy(diffusion, monkeypatch)
    r = fastdecode.generate(diffusion, PROMPTS[0], "dlm.baseline", max_new_tokens=GEN, block_length=8, cache="suffix")
    P = len(r.prompt_ids)
    assert len(calls) == r.stats.forwards == GEN
    assert calls[0] is None and calls[8] is None  # a full refresh at each new block
    assert calls[1] == [list(range(P + 8))] and calls[9] == [list(range(P + 16))]  # only the later masks are cached


def test_suffix_cache_reads_stale_kv_only_for_the_masks_after_the_block(diffusion, monkeypatch):
    """Refreshed at the block's start, the suffix cache differs from the uncached run only through the later
    masks' K/V: a canvas with no masks after the block gives exactly the uncached logits."""
    plain = fastdecode.generate(diffusion, PROMPTS, "dlm.baseline", max_new_tokens=8, block_length=8)
    cached = fastdecode.generate(diffusion, PROMPTS, "dlm.baseline", max_new_tokens=8, block_length=8, cache="suffix")
    assert [r.token_ids for r in cached] == [r.token_ids for r in plain]


def test_delayed_cache_recomputes_the_masks_and_the_tokens_committed_one_step_earlier(diffusion, monkeypatch):
    calls = spy(diffusion, monkeypatch)
    r = fastdecode.generate(diffusion, PROMPTS[0], "dlm.baseline", max_new_tokens=GEN, cache="delayed",
                            cache_refresh=100, trace=True)
    P = len(r.prompt_ids)
    assert calls[0] is None
    masked = set(range(GEN))
    for step in range(1, GEN):
        (previous,) = [o for o, _ in r.trace[step - 1].tokens[0]]
        masked.discard(previous)
        assert calls[step] == [sorted(P + o for o in masked | {previous})]  # cached from the step after next
    calls.clear()
    fastdecode.generate(diffusion, PROMPTS[0], "dlm.baseline", max_new_tokens=GEN, cache="delayed")
    assert [i for i, c in enumerate(calls) if c is None] == [0, 8]  # dKV-Cache's default refresh every 8 steps


def test_a_model_without_partial_forwards_refuses_caches(diffusion_dir):
    model = fastdecode.load(diffusion_dir)
    model.model.supports_partial_forward = False
    assert fastdecode.generate(model, "the", "dlm.threshold", max_new_tokens=4).stats.forwards >= 1
    with pytest.raises(fastdecode.IncompatibleMethodError, match="cache='dual' needs a model .* cache='none'"):
        fastdecode.generate(model, "the", "dlm.threshold", max_new_tokens=4, cache="dual")
