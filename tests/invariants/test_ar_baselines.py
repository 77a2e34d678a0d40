"""ar.greedy / ar.sample against transformers and against themselves (fp32, CPU, tiny random models)."""

from __future__ import annotations

import pytest
import torch

import fastdecode

PROMPTS = ["the quick brown fox", "def add(a, b):", "Sort this", "0123456789 ABC abc the lazy dog jumps"]


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    out = model.model.generate(
        torch.tensor([ids], device=model.device),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=model.device),
        do_sample=False, max_new_tokens=n, eos_token_id=1, pad_token_id=2,
    )
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_transformers_generate(causal, prompt):
    r = fastdecode.generate(causal, prompt, "ar.greedy", max_new_tokens=40)
    ref = hf_greedy(causal, r.prompt_ids, 40)
    assert r.token_ids == ref[: len(r.token_ids)]
    if r.stats.finish_reason == "eos":
        assert r.token_ids[-1] == 1 and len(ref) == len(r.token_ids)
    assert r.stats.forwards == r.stats.new_tokens  # one forward per token, prefill included


def test_batched_greedy_equals_one_by_one(causal):
    batched = fastdecode.generate(causal, PROMPTS, "ar.greedy", max_new_tokens=30)
    assert len({len(r.prompt_ids) for r in batched}) > 1  # really different lengths, so left padding is used
    for prompt, b in zip(PROMPTS, batched, strict=True):
        single = fastdecode.generate(causal, prompt, "ar.greedy", max_new_tokens=30)
        assert b.token_ids == single.token_ids
        assert b.stats.new_tokens == single.stats.new_tokens == b.stats.forwards


def test_greedy_stops_at_eos_and_counts_it(causal_dir):
    model = fastdecode.load(causal_dir)
    free_run = fastdecode.generate(model, PROMPTS, max_new_tokens=20)
    # declare a token the model emits mid-sequence to be EOS: every row must stop at its first occurrence
    stop = free_run[0].token_ids[5]
    model.model.generation_config.eos_token_id = [1, stop]
    stopped = fastdecode.generate(model, PROMPTS, max_new_tokens=20)
    for free, r in zip(free_run, stopped, strict=True):
        cut = free.token_ids.index(stop) + 1 if stop in free.token_ids else len(free.token_ids)
        assert r.token_ids == free.token_ids[:cut]
        assert r.stats.new_tokens == r.stats.forwards == cut
        assert r.stats.finish_reason == ("eos" if stop in free.token_ids else free.stats.finish_reason)
    assert stopped[0].stats.finish_reason == "eos" and stopped[0].token_ids[-1] == stop


def test_max_new_tokens_is_respected(causal):
    r = fastdecode.generate(causal, "the quick", max_new_tokens=3)
    assert len(r.token_ids) <= 3 and r.stats.forwards <= 3


def test_seeded_sampling_repeats_and_seeds_differ(causal):
    kw = dict(max_new_tokens=24, temperature=1.5)
    a = fastdecode.generate(causal, PROMPTS, "ar.sample", seed=7, **kw)
    b = fastdecode.generate(causal, PROMPTS, "ar.sample", seed=7, **kw)
    c = fastdecode.generate(causal, PROMPTS, "ar.sample", seed=8, **kw)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [r.token_ids for r in a] != [r.token_ids for r in c]


def test_explicit_generator_is_used(causal):
    g1 = torch.Generator(device=causal.device).manual_seed(3)
    g2 = torch.Generator(device=causal.device).manual_seed(3)
    a = fastdecode.generate(causal, "the", "ar.sample", generator=g1, max_new_tokens=16, temperature=2.0)
    b = fastdecode.generate(causal, "the", "ar.sample", generator=g2, max_new_tokens=16, temperature=2.0)
    assert a.token_ids == b.token_ids


def test_sampling_at_temperature_zero_or_top_k_one_is_greedy(causal):
    greedy = fastdecode.generate(causal, PROMPTS[0], max_new_tokens=20).token_ids
    sampled = fastdecode.generate(causal, PROMPTS[0], "ar.sample", temperature=0, max_new_tokens=20, seed=1)
    assert sampled.token_ids == greedy
    assert fastdecode.generate(causal, PROMPTS[0], "ar.sample", top_k=1, max_new_tokens=20, seed=1).token_ids == greedy


def test_repetition_penalty_changes_greedy_choice(causal):
    plain = fastdecode.generate(causal, PROMPTS[1], "ar.sample", temperature=0, max_new_tokens=30).token_ids
    penalised = fastdecode.generate(
        causal, PROMPTS[1], "ar.sample", temperature=0, repetition_penalty=50.0, max_new_tokens=30
    ).token_ids
    # a huge penalty forbids any repeat among generated tokens unless nothing else is left
    assert len(set(penalised)) == len(penalised)
    assert plain != penalised or len(set(plain)) == len(plain)


def test_stream_yields_steps_then_results(causal):
    events = list(fastdecode.stream(causal, "the quick", max_new_tokens=5))
    steps = [e for e in events if isinstance(e, fastdecode.StepEvent)]
    assert isinstance(events[-1], fastdecode.Finished)
    (result,) = events[-1].results
    streamed = [t for e in steps for _, t in e.tokens[0]]
    assert streamed[: len(result.token_ids)] == result.token_ids
    assert len(steps) == result.stats.forwards


def test_trace_is_kept_on_request(causal):
    r = fastdecode.generate(causal, "the quick", max_new_tokens=4, trace=True)
    assert r.trace is not None and len(r.trace) == r.stats.forwards
    assert fastdecode.generate(causal, "the quick", max_new_tokens=4).trace is None
