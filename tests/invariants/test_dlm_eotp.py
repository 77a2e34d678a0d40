"""End-of-Text Prediction (`eotp=True`, every `dlm.*` method): what it keeps and what it drops.

Kept, for every method and cache: the run is the run without it up to and including the step that commits the
first EOS (nothing differs before an EOS exists). After it: no later step commits past that EOS, and the columns
after it leave every forward. Token for token the same output: `dlm.baseline` at one token per step (and
`dlm.freedave`, which equals it) on a model whose predictions before a column never depend on the columns after it
(a causal toy); on a bidirectional model the settled tail changes what every position sees, and on the rules that
count or rank the dropped masks with the others (a top-1 fallback, a top-k schedule, a mean over masks) the
choices change with them, so those claim no more than the prefix above.
"""

from __future__ import annotations

import pytest
import torch

import fastdecode

PROMPTS = ["the quick brown fox", "def add(a, b):", "Sort this"]
GEN = 16
METHODS = [m.name for m in fastdecode.methods("diffusion")]
KW = dict(max_new_tokens=GEN, block_length=8)


def kw(name: str, **extra) -> dict:
    params = {p for p, _ in fastdecode.get_method(name).params()}
    return {k: v for k, v in {**KW, **extra}.items() if k in params}


class Causal(torch.nn.Module):
    """The tiny MDLM with a causal attention mask: a column's logits never depend on the columns after it."""

    supports_partial_forward = False  # full forwards only (caches are refused)

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.config = inner, inner.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_):
        B, L = input_ids.shape
        dev = input_ids.device
        keys = torch.ones(B, L, dtype=torch.bool, device=dev) if attention_mask is None else attention_mask.bool()
        allowed = torch.ones(L, L, dtype=torch.bool, device=dev).tril()[None, None] & keys[:, None, None, :]
        allowed |= torch.eye(L, dtype=torch.bool, device=dev)[None, None]  # a padding column sees itself, never NaN
        positions = (keys.long().cumsum(-1) - 1).clamp(min=0)
        return self.inner(input_ids=input_ids, attention_mask=allowed, position_ids=positions)


def sharpened(diffusion_dir, causal: bool = False):
    model = fastdecode.load(diffusion_dir)
    with torch.no_grad():
        model.model.lm_head.weight.mul_(50.0)  # confident predictions: several commits per step
    if causal:
        model.model = Causal(model.model)
    return model


def make_eos(model, prompt: str, name: str, **params) -> int | None:
    """Declare as EOS a token the run commits early, before some later position: (with it as EOS) a case where
    EoTP has masks to settle. None when the run has no such token."""
    free = fastdecode.generate(model, prompt, name, trace=True, **kw(name, **params))
    when = {o: e.index for e in free.trace for o, _ in e.tokens[0]}
    ids = free.token_ids
    for j, t in sorted(enumerate(ids), key=lambda p: when[p[0]]):
        if t not in ids[:j] and t != model.mask_token_id and any(when[o] > when[j] for o in range(j + 1, len(ids))):
            return t
    return None


def eos_steps(result, eos: set[int]) -> tuple[int, list[int]]:
    """(position in the trace of the first event that commits an EOS, and per event the leftmost EOS offset
    committed by the end of it, GEN while none)."""
    at, left, ends = None, GEN, []
    for i, e in enumerate(result.trace):
        for o, t in e.tokens[0]:
            if t in eos:
                at, left = i if at is None else at, min(left, o)
        ends.append(left)
    assert at is not None, "the run committed no EOS"
    return at, ends


def widths(model, calls: list[int]) -> None:
    """Record the canvas width of every forward the model runs."""
    inner = model.model

    def spy(*args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        index = kwargs.get("query_index")
        calls.append(int(kwargs["cache"][0].k.shape[2]) if index is not None else int(ids.shape[1]))
        return original(*args, **kwargs)

    original = inner.forward
    inner.forward = spy


@pytest.mark.parametrize("name", METHODS)
def test_eotp_equals_the_plain_run_until_the_first_eos_and_drops_what_follows(diffusion_dir, name):
    settled = 0
    for prompt in PROMPTS:
        model = sharpened(diffusion_dir)
        stop = make_eos(model, prompt, name)
        if stop is None:
            continue
        model.config.eos_token_id = [1, stop]
        eos = {1, stop}
        plain = fastdecode.generate(model, prompt, name, trace=True, **kw(name, eotp=False))  # learn2pd: on
        calls: list[int] = []
        widths(model, calls)
        fast = fastdecode.generate(model, prompt, name, trace=True, **kw(name, eotp=True))
        at, ends = eos_steps(fast, eos)
        # the same steps, commits and tokens until an EOS is committed (FreeDave: until the round that commits it,
        # whose later drafts are settled)
        same = at if name == "dlm.freedave" else at + 1
        assert fast.trace[:same] == plain.trace[:same]
        assert all(o < ends[i - 1] for i in range(at + 1, len(ends)) for o, _ in fast.trace[i].tokens[0])
        assert fast.token_ids[-1] in eos and fast.stats.finish_reason == "eos"
        P = calls[0] - GEN
        if len(calls) == len(fast.trace):  # one forward per step: step i + 1 sees the canvas through the EOS
            assert calls[: at + 1] == [P + GEN] * (at + 1)
            assert calls[at + 1 :] == [P + ends[i] + 1 for i in range(at, len(ends) - 1)]
        before = at + 1
        assert max(calls[len(calls) - len(fast.trace) + before :], default=0) < P + GEN
        settled += len(calls) > before
    assert settled, f"{name}: no prompt reached a step after a settled EOS"


@pytest.mark.parametrize("name, params", [
    ("dlm.baseline", dict(block_length=8)),
    ("dlm.baseline", dict(block_length=None)),
    ("dlm.freedave", dict(block_length=8)),
])
def test_one_token_per_step_keeps_every_token_on_a_causal_model(diffusion_dir, name, params):
    """At one token per step the dropped masks only ever took steps of their own; where they cannot change the
    columns before the EOS (a causal model), EoTP removes exactly those steps."""
    saved = 0
    for prompt in PROMPTS:
        model = sharpened(diffusion_dir, causal=True)
        stop = make_eos(model, prompt, name, **params)
        if stop is None:
            continue
        model.config.eos_token_id = [1, stop]
        plain = fastdecode.generate(model, prompt, name, **kw(name, **params))
        fast = fastdecode.generate(model, prompt, name, **kw(name, eotp=True, **params))
        assert fast.token_ids == plain.token_ids
        assert fast.stats.forwards <= plain.stats.forwards
        saved += plain.stats.forwards - fast.stats.forwards
    assert saved > 0, "no prompt had a step past its EOS to save"


def test_freedave_equals_the_baseline_with_eotp_on_both(diffusion_dir):
    model = sharpened(diffusion_dir)
    stop = make_eos(model, PROMPTS[0], "dlm.baseline")
    model.config.eos_token_id = [1, stop]
    for cache in ("none", "dual"):
        base = fastdecode.generate(model, PROMPTS, "dlm.baseline", eotp=True, cache=cache, **KW)
        free = fastdecode.generate(model, PROMPTS, "dlm.freedave", eotp=True, cache=cache, **KW)
        assert [r.token_ids for r in free] == [r.token_ids for r in base]


@pytest.mark.parametrize("cache", ["prefix", "dual", "suffix", "delayed", "window"])
@pytest.mark.parametrize("name", ["dlm.baseline", "dlm.threshold", "dlm.dcd"])
def test_caches_are_cut_with_the_canvas(diffusion_dir, name, cache):
    """A cache refreshed every step gives the uncached result with EoTP too; with its own refresh it runs."""
    model = sharpened(diffusion_dir)
    stop = make_eos(model, PROMPTS[0], name)
    model.config.eos_token_id = [1, stop]
    plain = fastdecode.generate(model, PROMPTS, name, eotp=True, **kw(name))
    every = fastdecode.generate(model, PROMPTS, name, eotp=True, cache=cache, cache_refresh=1, **kw(name))
    assert [r.token_ids for r in every] == [r.token_ids for r in plain]
    for r in fastdecode.generate(model, PROMPTS, name, eotp=True, cache=cache, **kw(name)):
        assert r.stats.new_tokens == len(r.token_ids) >= 1


@pytest.mark.parametrize("name", METHODS)
def test_batched_equals_one_by_one_with_eotp(diffusion_dir, name):
    model = sharpened(diffusion_dir)
    stop = make_eos(model, PROMPTS[1], name)
    model.config.eos_token_id = [1] if stop is None else [1, stop]
    batched = fastdecode.generate(model, PROMPTS, name, eotp=True, **kw(name))
    for prompt, r in zip(PROMPTS, batched, strict=True):
        single = fastdecode.generate(model, prompt, name, eotp=True, **kw(name))
        assert r.token_ids == single.token_ids and r.stats.forwards == single.stats.forwards


def test_eotp_keep_settles_the_same_way_but_keeps_the_columns(diffusion_dir):
    model = sharpened(diffusion_dir)
    stop = make_eos(model, PROMPTS[0], "dlm.threshold")
    model.config.eos_token_id = [1, stop]
    plain = fastdecode.generate(model, PROMPTS[0], "dlm.threshold", trace=True, **KW)
    calls: list[int] = []
    widths(model, calls)
    kept = fastdecode.generate(model, PROMPTS[0], "dlm.threshold", trace=True, eotp=True, eotp_keep=True, **KW)
    at, ends = eos_steps(kept, {1, stop})
    assert kept.trace[: at + 1] == plain.trace[: at + 1]
    assert all(o < ends[i - 1] for i in range(at + 1, len(ends)) for o, _ in kept.trace[i].tokens[0])
    assert len(set(calls)) == 1  # every forward sees the whole canvas
    with pytest.raises(fastdecode.ParameterError, match="eotp_keep"):
        fastdecode.generate(model, "the", "dlm.threshold", max_new_tokens=4, eotp_keep=True)
