"""dlm.baseline against a plain LLaDA `generate` and against itself (fp32, CPU, tiny random MDLM)."""

from __future__ import annotations

import pytest
import torch

import fastdecode
from fastdecode.diffusion.scores import num_transfer_tokens

PROMPTS = ["the quick brown fox", "def add(a, b):", "Sort this", "0123456789 ABC abc the lazy dog jumps"]
GEN = 16


def llada_generate(model, prompt: list[int], gen: int, block: int, steps: int) -> list[int]:
    """LLaDA's reference `generate` (batch of 1, no CFG, no early stop); its generated region.

    Two choices of fastdecode are kept: the confidence softmax is float64, and MASK is never predicted.
    """
    mask_id, P = model.mask_token_id, len(prompt)
    x = torch.tensor([prompt + [mask_id] * gen])
    steps = steps // (gen // block)
    for b in range(gen // block):
        n = int((x[0, P + b * block : P + (b + 1) * block] == mask_id).sum())
        k = [n // steps + (i < n % steps) for i in range(steps)]
        for i in range(steps):
            mask_index = x == mask_id
            logits = model.forward(x).clone()
            logits[..., mask_id] = float("-inf")
            x0 = logits.argmax(-1)
            x0_p = torch.softmax(logits.double(), -1).gather(-1, x0[..., None]).squeeze(-1)
            x0_p[:, P + (b + 1) * block :] = float("-inf")
            x0 = torch.where(mask_index, x0, x)
            conf = torch.where(mask_index, x0_p, float("-inf"))
            _, select = torch.topk(conf[0], k=k[i])
            x[0, select] = x0[0, select]
    return x[0, P:].tolist()


def commit_steps(result) -> dict[int, int]:
    """offset -> the step that committed it, from a single-row trace."""
    return {o: e.index for e in result.trace for o, _ in e.tokens[0]}


def eos_stop(model, prompt: str, **kw) -> tuple[int, int]:
    """A token the free run commits at offset j, first there, so declaring it EOS stops the run early: (token, j)."""
    free = fastdecode.generate(model, prompt, "dlm.baseline", trace=True, **kw)
    when, ids = commit_steps(free), free.token_ids
    for j, t in enumerate(ids):
        if t not in ids[:j] and max(when[o] for o in range(j + 1)) < len(free.trace) - 1:
            return t, j
    raise AssertionError("no token of the free run would stop it early")


@pytest.mark.parametrize("block_length", [None, 8])
@pytest.mark.parametrize("steps", [GEN, GEN // 2])
@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_equals_llada_generate(diffusion, prompt, block_length, steps):
    r = fastdecode.generate(diffusion, prompt, "dlm.baseline", max_new_tokens=GEN, block_length=block_length, steps=steps)
    ref = llada_generate(diffusion, r.prompt_ids, GEN, block_length or GEN, steps)
    eos = [i for i, t in enumerate(ref) if t in diffusion.eos_token_ids]
    assert r.token_ids == ref[: eos[0] + 1 if eos else GEN]


@pytest.mark.parametrize("block_length, steps", [(None, GEN), (None, 5), (4, GEN), (4, 8)])
def test_at_least_one_token_per_step_on_the_schedule(diffusion, block_length, steps):
    r = fastdecode.generate(diffusion, PROMPTS[0], "dlm.baseline", max_new_tokens=GEN, block_length=block_length,
                            steps=steps, trace=True)
    blocks = GEN // (block_length or GEN)
    schedule = num_transfer_tokens(torch.tensor([GEN // blocks]), steps // blocks)[0].tolist() * blocks
    assert [e.accepted[0] for e in r.trace] == schedule and min(schedule) >= 1
    assert r.stats.forwards == len(r.trace) == steps and r.stats.accepted == GEN
    assert [e.proposed[0] for e in r.trace][:2] == [GEN // blocks, GEN // blocks - schedule[0]]


@pytest.mark.parametrize("block_length", [None, 8])
@pytest.mark.parametrize("with_eos", [False, True])
def test_batched_equals_one_by_one(diffusion, monkeypatch, block_length, with_eos):
    kw = dict(max_new_tokens=GEN, block_length=block_length)
    if with_eos:  # rows then finish at different steps
        stop, _ = eos_stop(diffusion, PROMPTS[0], **kw)
        monkeypatch.setattr(diffusion.config, "eos_token_id", [1, stop])
    events = list(fastdecode.stream(diffusion, PROMPTS, "dlm.baseline", **kw))
    batched = events[-1].results
    assert len({len(r.prompt_ids) for r in batched}) > 1  # really different lengths, so left padding is used
    for b, (prompt, r) in enumerate(zip(PROMPTS, batched)):
        single = fastdecode.generate(diffusion, prompt, "dlm.baseline", **kw)
        assert r.token_ids == single.token_ids
        assert r.stats.forwards == single.stats.forwards and r.stats.accepted == single.stats.accepted
        done = [i for i, e in enumerate(events[:-1]) if e.finished[b]]
        assert done == list(range(done[0], len(events) - 1))  # once finished, always finished
        assert all(e.tokens[b] == () and e.accepted[b] == 0 for e in events[done[0] + 1 : -1])
    if with_eos:
        assert len({r.stats.forwards for r in batched}) > 1


@pytest.mark.parametrize("block_length", [None, 4])
def test_eos_stops_the_row_and_counts_through_it(diffusion_dir, block_length):
    model = fastdecode.load(diffusion_dir)
    kw = dict(max_new_tokens=GEN, block_length=block_length)
    free = fastdecode.generate(model, PROMPTS[1], "dlm.baseline", trace=True, **kw)
    stop, j = eos_stop(model, PROMPTS[1], **kw)
    model.config.eos_token_id = [1, stop]
    r = fastdecode.generate(model, PROMPTS[1], "dlm.baseline", **kw)
    settled = max(commit_steps(free)[o] for o in range(j + 1)) + 1  # forwards until offsets 0..j are decoded
    assert r.token_ids == free.token_ids[: j + 1] and r.stats.new_tokens == j + 1
    assert r.stats.forwards == settled < GEN and r.stats.finish_reason == "eos"


@pytest.mark.parametrize("remasking", ["low_confidence", "random"])
def test_seeded_sampling_repeats_and_seeds_differ(diffusion, remasking):
    kw = dict(max_new_tokens=GEN, block_length=8, temperature=1.0, remasking=remasking)
    a, b, c = (fastdecode.generate(diffusion, PROMPTS, "dlm.baseline", seed=s, **kw) for s in (7, 7, 8))
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [r.token_ids for r in a] != [r.token_ids for r in c]
    g = torch.Generator().manual_seed(7)
    assert fastdecode.generate(diffusion, PROMPTS, "dlm.baseline", generator=g, **kw)[0].token_ids == a[0].token_ids


@pytest.mark.parametrize(
    "params, words",
    [
        (dict(block_length=5), "must divide max_new_tokens=16"),
        (dict(block_length=0), "must divide max_new_tokens=16"),
        (dict(block_length=4, steps=6), "divisible by the number of blocks, 4"),
        (dict(steps=17), "between 1 and max_new_tokens=16"),
        (dict(temperature=-1.0), "temperature"),
        (dict(remasking="entropy"), "'low_confidence', 'random'"),
    ],
)
def test_bad_parameters_are_refused_with_the_rule(diffusion, params, words):
    with pytest.raises(fastdecode.ParameterError, match=words):
        fastdecode.generate(diffusion, "the", "dlm.baseline", max_new_tokens=GEN, **params)
