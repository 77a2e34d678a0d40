"""Invariants every `dlm.*` method keeps, enumerated from the registry (fp32, CPU, tiny random MDLM).

The model's output layer is sharpened so the adaptive rules really commit several tokens per step.
"""

from __future__ import annotations

import pytest
import torch

import fastdecode

PROMPTS = ["the quick brown fox", "def add(a, b):", "Sort this", "0123456789 ABC abc the lazy dog jumps"]
GEN = 16
METHODS = [m.name for m in fastdecode.methods("diffusion")]
KW = dict(max_new_tokens=GEN, block_length=8, eotp=False)  # every dlm method but dlm.dcd has blocks; EoTP off
# (dlm.learn2pd has it on by default; tests/invariants/test_dlm_eotp.py covers it)


def kw(name: str, **extra) -> dict:
    params = {p for p, _ in fastdecode.get_method(name).params()}
    return {k: v for k, v in {**KW, **extra}.items() if k in params}


@pytest.fixture(scope="module")
def sharp(diffusion_dir):
    model = fastdecode.load(diffusion_dir)
    with torch.no_grad():
        model.model.lm_head.weight.mul_(50.0)  # confident predictions: thresholds pass, several commits per step
    return model


def commits(result) -> list[list[int]]:
    return [[o for o, _ in e.tokens[0]] for e in result.trace]


@pytest.mark.parametrize("name", METHODS)
def test_every_step_commits_masked_positions_once_and_never_rewrites_them(sharp, name):
    for prompt in PROMPTS:
        r = fastdecode.generate(sharp, prompt, name, trace=True, **kw(name))
        seen: set[int] = set()
        for e in r.trace:
            offsets = [o for o, _ in e.tokens[0]]
            assert offsets, f"{name}: a step committed nothing"
            assert not seen & set(offsets) and len(set(offsets)) == len(offsets)  # only masks, each once
            assert e.accepted[0] == len(offsets) <= e.proposed[0]
            seen |= set(offsets)
        assert r.token_ids == [dict(p for e in r.trace for p in e.tokens[0])[o] for o in range(len(r.token_ids))]
        assert r.stats.forwards == sum(e.forwards for e in r.trace) >= 1


def test_adaptive_methods_commit_several_tokens_per_step_on_a_confident_model(sharp):
    for name in ["dlm.threshold", "dlm.factor", "dlm.localleap", "dlm.credit", "dlm.r2", "dlm.ete", "dlm.dcd",
                 "dlm.adablock", "dlm.freedave"]:
        rs = fastdecode.generate(sharp, PROMPTS, name, **kw(name))
        assert sum(r.stats.forwards for r in rs) < sum(r.stats.new_tokens for r in rs), name


def eos_candidate(free) -> tuple[int, int] | None:
    """A token first committed at offset j, with offsets 0..j settled before the run's last step: (token, j)."""
    when = {o: e.index for e in free.trace for o, _ in e.tokens[0]}
    ids = free.token_ids
    for j, t in enumerate(ids):
        if t not in ids[:j] and max(when[o] for o in range(j + 1)) < free.trace[-1].index:
            return t, j
    return None


@pytest.mark.parametrize("name", [m for m in METHODS if m not in ("dlm.dcd", "dlm.dystruct")])
# dcd's window itself stops at an EOS; dystruct reads the EOS probabilities (its length posterior), so naming
# another token EOS changes its run before that token is committed (tests/invariants/test_dlm_dystruct.py)
def test_committing_eos_stops_the_row_once_everything_before_it_is_decoded(diffusion_dir, name):
    for prompt in PROMPTS[:2]:
        model = fastdecode.load(diffusion_dir)
        with torch.no_grad():
            model.model.lm_head.weight.mul_(50.0)
        free = fastdecode.generate(model, prompt, name, trace=True, **kw(name))
        found = eos_candidate(free)
        if found is None:
            continue
        stop, j = found
        model.config.eos_token_id = [1, stop]
        r = fastdecode.generate(model, prompt, name, **kw(name))
        settled = max(e.index for e in free.trace for o, _ in e.tokens[0] if o <= j)
        assert r.token_ids == free.token_ids[: j + 1] and r.stats.new_tokens == j + 1
        assert r.stats.finish_reason == "eos"
        spent = sum(e.forwards for e in free.trace if e.index <= settled)
        if name == "dlm.freedave":  # the round that reaches the EOS needs no forward for drafts past it
            assert r.stats.forwards <= spent < free.stats.forwards
        else:
            assert r.stats.forwards == spent < free.stats.forwards


def test_dcd_window_stops_at_a_decoded_eos(diffusion_dir):
    model = fastdecode.load(diffusion_dir)
    with torch.no_grad():
        model.model.lm_head.weight.mul_(50.0)
    free = fastdecode.generate(model, PROMPTS[0], "dlm.dcd", trace=True, max_new_tokens=GEN)
    stop, j = eos_candidate(free)
    model.config.eos_token_id = [1, stop]
    r = fastdecode.generate(model, PROMPTS[0], "dlm.dcd", trace=True, max_new_tokens=GEN)
    assert r.token_ids[-1] == stop and stop not in r.token_ids[:-1] and r.stats.finish_reason == "eos"
    at, first = min((e.index, o) for e in r.trace for o, t in e.tokens[0] if t == stop)
    assert all(o < first for e in r.trace[at + 1 :] for o, _ in e.tokens[0])  # later steps stay before the EOS


@pytest.mark.parametrize("name", METHODS)
def test_batched_equals_one_by_one(sharp, name):
    batched = fastdecode.generate(sharp, PROMPTS, name, **kw(name))
    for prompt, r in zip(PROMPTS, batched, strict=True):
        single = fastdecode.generate(sharp, prompt, name, **kw(name))
        assert r.token_ids == single.token_ids and r.stats.forwards == single.stats.forwards


@pytest.mark.parametrize("name", METHODS)
def test_seeded_sampling_repeats_and_seeds_differ(diffusion, name):
    args = kw(name, temperature=1.0)
    a, b, c = (fastdecode.generate(diffusion, PROMPTS, name, seed=s, **args) for s in (7, 7, 8))
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [r.token_ids for r in a] != [r.token_ids for r in c]


@pytest.mark.parametrize("name", METHODS)
def test_parameters_are_validated_with_the_rule(diffusion, name):
    with pytest.raises(fastdecode.ParameterError, match="temperature"):
        fastdecode.generate(diffusion, "the", name, max_new_tokens=4, temperature=-1.0)
    with pytest.raises(fastdecode.ParameterError, match="'none', 'prefix', 'dual'"):
        fastdecode.generate(diffusion, "the", name, max_new_tokens=4, cache="paged")
    with pytest.raises(fastdecode.ParameterError, match="cache_refresh"):
        fastdecode.generate(diffusion, "the", name, max_new_tokens=4, cache_refresh=0)


@pytest.mark.parametrize("name, params, words", [
    ("dlm.threshold", dict(threshold=1.5), "threshold"),
    ("dlm.factor", dict(factor=0.0), "factor"),
    ("dlm.entropy_bound", dict(gamma=-0.1), "gamma"),
    ("dlm.localleap", dict(relaxed_threshold=0.95), "relaxed_threshold"),
    ("dlm.prophet", dict(steps=6, block_length=4), "divisible by the number of blocks, 4"),
    ("dlm.credit", dict(beta=1.5), "beta"),
    ("dlm.freedave", dict(draft_steps=0), "draft_steps"),
    ("dlm.freedave", dict(cache="delayed"), "order of past steps"),
    ("dlm.adablock", dict(window_fraction=0.0), "window_fraction"),
    ("dlm.dcd", dict(window=8, max_window=4), "max_window"),
    ("dlm.ccd", dict(history=1), "history"),
    ("dlm.ete", dict(explore_floor=0.95), "explore_floor"),
    ("dlm.r2", dict(stable_steps=0), "stable_steps"),
])
def test_method_parameters_are_refused_with_the_rule(diffusion, name, params, words):
    with pytest.raises(fastdecode.ParameterError, match=words):
        fastdecode.generate(diffusion, "the", name, max_new_tokens=GEN, **params)
