"""dlm.baseline against LLaDA's `generate`, re-written unmodified in this file, and against itself (fp32, CPU,
tiny random MDLM)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fastdecode
from fastdecode.diffusion.policies import baseline
from fastdecode.diffusion.scores import num_transfer_tokens

PROMPTS = ["the quick brown fox", "def add(a, b):", "Sort this", "0123456789 ABC abc the lazy dog jumps"]
GEN = 16


def llada_generate(logits_fn, prompt: torch.Tensor, attention_mask: torch.Tensor | None, steps: int, gen_length: int,
                   block_length: int, mask_id: int, cfg_scale: float = 0.0, logits_eos_inf: bool = False,
                   confidence_eos_eot_inf: bool = False, eos_id: int = -1, eot_id: int = -1) -> torch.Tensor:
    """LLaDA's `generate` (ML-GSAI/LLaDA generate.py) at temperature 0 with low-confidence remasking, re-written
    step by step from the reference and left unmodified (a float32 softmax, top-k by confidence, no early stop, batches
    left-padded with an attention mask, classifier-free guidance by a doubled batch, and the two EOS switches,
    where the chained assignment of `confidence_eos_eot_inf` reaches both EOS and EoT at temperature 0, since the
    noisy logits are then the logits). The one choice made here is where the reference has none: torch.topk leaves the
    order of exactly equal confidences unspecified (confidence_eos_eot_inf makes every EOS/EoT prediction 0), and
    this takes the lower position first, as fastdecode does. `logits_fn(x, attention_mask)` is the model:
    `[B, T]` -> `[B, T, V]`.
    Returns the whole canvas `[B, P + gen_length]`."""
    B, P = prompt.shape
    x = torch.full((B, P + gen_length), mask_id, dtype=torch.long)
    x[:, :P] = prompt
    if attention_mask is not None:
        attention_mask = torch.cat([attention_mask, torch.ones(B, gen_length, dtype=attention_mask.dtype)], dim=-1)
    prompt_index = x != mask_id
    num_blocks = gen_length // block_length
    steps = steps // num_blocks
    for b in range(num_blocks):
        lo, hi = P + b * block_length, P + (b + 1) * block_length
        n = (x[:, lo:hi] == mask_id).sum(dim=1, keepdim=True)
        k = torch.zeros(B, steps, dtype=torch.long) + n // steps
        for j in range(B):
            k[j, : int(n[j] % steps)] += 1
        for i in range(steps):
            mask_index = x == mask_id
            if cfg_scale > 0:
                un_x = x.clone()
                un_x[prompt_index] = mask_id
                both = logits_fn(torch.cat([x, un_x]), None if attention_mask is None else attention_mask.repeat(2, 1))
                cond, un = torch.chunk(both, 2, dim=0)
                logits = un + (cfg_scale + 1) * (cond - un)
            else:
                logits = logits_fn(x, attention_mask)
            if logits_eos_inf:
                logits[:, :, eos_id] = -torch.inf
            x0 = torch.argmax(logits, dim=-1)
            if confidence_eos_eot_inf:
                logits[:, :, eos_id] = logits[:, :, eot_id] = -torch.inf
            x0_p = torch.gather(F.softmax(logits, dim=-1), -1, x0[..., None]).squeeze(-1)
            x0_p[:, hi:] = -np.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, -np.inf)
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            for j in range(B):  # torch.topk; its order among exactly equal values is unspecified, so here the lower
                select = confidence[j].argsort(descending=True, stable=True)[: int(k[j, i])]  # position goes first
                transfer[j, select] = True
            x[transfer] = x0[transfer]
    return x


def model_logits(model):
    """The tiny model as LLaDA's loop sees it: full-canvas logits, MASK never predicted (a trained LLaDA never
    predicts it; the random tiny model would, so the model, not the loop, is given that property). The logit is
    finite, as a real model's, so that guidance's difference of two logits stays a number. The loop runs on the CPU
    whatever the model's device: the canvas goes to the model, the logits come back."""
    def fn(x, attention_mask):
        mask = None if attention_mask is None else attention_mask.to(model.device)
        logits = model.forward(x.to(model.device), mask).cpu().clone()  # [B, T, V]
        logits[..., model.mask_token_id] = -1e9
        return logits
    return fn


def through_eos(ids: list[int], eos) -> list[int]:
    cut = next((i + 1 for i, t in enumerate(ids) if t in eos), len(ids))
    return ids[:cut]


def padded(model, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [model.encode(p) for p in prompts]
    width = max(map(len, rows))
    ids = torch.tensor([[model.pad_token_id] * (width - len(r)) + r for r in rows])
    return ids, torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])


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
    r = fastdecode.generate(diffusion, prompt, "dlm.baseline", max_new_tokens=GEN, block_length=block_length,
                            steps=steps)
    ids = torch.tensor([r.prompt_ids])
    ref = llada_generate(model_logits(diffusion), ids, None, steps, GEN, block_length or GEN, diffusion.mask_token_id)
    assert r.token_ids == through_eos(ref[0, ids.shape[1]:].tolist(), diffusion.eos_token_ids)


@pytest.mark.parametrize(
    "params",
    [
        dict(cfg_scale=1.0),
        dict(cfg_scale=0.5, block_length=8),
        dict(logits_eos_inf=True),
        dict(confidence_eos_eot_inf=True, block_length=8),
        dict(cfg_scale=2.0, logits_eos_inf=True, confidence_eos_eot_inf=True, steps=GEN // 2),
    ],
)
def test_equals_llada_generate_with_guidance_and_eos_switches_in_a_batch(diffusion, monkeypatch, params):
    block, steps = params.pop("block_length", None), params.pop("steps", GEN)
    kw = dict(max_new_tokens=GEN, block_length=block, steps=steps)
    # the two tokens the model predicts most stand in for EOS and EoT, so that the switches change the output
    counts = Counter(t for r in fastdecode.generate(diffusion, PROMPTS, "dlm.baseline", **kw) for t in r.token_ids)
    (eos, _), (eot, _) = counts.most_common(2)
    monkeypatch.setattr(diffusion.config, "eos_token_id", [eos])
    monkeypatch.setattr(baseline, "end_tokens", lambda model: ([eos], [eot]))
    results = fastdecode.generate(diffusion, PROMPTS, "dlm.baseline", **kw, **params)
    ids, attention = padded(diffusion, PROMPTS)
    ref = llada_generate(model_logits(diffusion), ids, attention, steps, GEN, block or GEN, diffusion.mask_token_id,
                         eos_id=eos, eot_id=eot, **params)
    plain = fastdecode.generate(diffusion, PROMPTS, "dlm.baseline", **kw)
    assert [r.token_ids for r in results] != [r.token_ids for r in plain]  # the switch changes something here
    for row, r in enumerate(results):
        assert r.token_ids == through_eos(ref[row, ids.shape[1]:].tolist(), diffusion.eos_token_ids)
    if params.get("logits_eos_inf"):
        assert all(eos not in r.token_ids for r in results)


def test_guidance_refuses_a_cache(diffusion):
    with pytest.raises(fastdecode.ParameterError, match="cfg_scale"):
        fastdecode.generate(diffusion, "the", "dlm.baseline", max_new_tokens=GEN, cfg_scale=1.0, cache="dual")


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
    for b, (prompt, r) in enumerate(zip(PROMPTS, batched, strict=True)):
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
    g = torch.Generator(device=diffusion.device).manual_seed(7)
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
