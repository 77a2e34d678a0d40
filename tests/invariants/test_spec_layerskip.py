"""spec.layerskip on tiny fp32 models: greedy equals ar.greedy (fixed set and search, batched, EOS and
max_new_tokens inside a draft, other architectures), the drafter's cache rolls back, the model is left as it
was, the search scores and adopts sets, and bad parameters or models are refused."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, GPTNeoXConfig, GPTNeoXForCausalLM

import fastdecode
from fastdecode.errors import IncompatibleMethodError, ParameterError
from fastdecode.speculative.drafter import Verification
from fastdecode.speculative.drafters.layerskip import (
    LayerSkipConfig,
    LayerSkipDrafter,
    SkipSearch,
    decoder_layers,
    skipping,
)

PROMPTS = ["the quick brown fox", "def add(a, b):", "Sort this", "0123456789 ABC abc the lazy dog jumps"]


@pytest.fixture(scope="module")
def deep(tmp_path_factory, tokenizer, save_causal_model):
    """A 6-layer tiny Llama: four searchable layers (1..4), two of them skipped at the default ratio."""
    return fastdecode.load(save_causal_model(tmp_path_factory.mktemp("tiny-llama-6"), tokenizer, num_hidden_layers=6))


@pytest.fixture(scope="module")
def baseline(causal):
    return [r.token_ids for r in fastdecode.generate(causal, PROMPTS, "ar.greedy", max_new_tokens=40)]


CASES = [
    {},  # the default search (a 2-layer model has one candidate set: layer 1)
    {"skip_layers": "1"},
    {"skip_layers": "1", "confidence_stop": 0.0, "max_draft_tokens": 3},
    {"context_window": 4, "search_steps": 3, "confidence_stop": 0.5},
]


@pytest.mark.parametrize("params", CASES)
def test_batched_greedy_equals_ar_greedy(causal, baseline, params):
    results = fastdecode.generate(causal, PROMPTS, "spec.layerskip", max_new_tokens=40, **params)
    assert [r.token_ids for r in results] == baseline
    for r in results:
        s = r.stats
        assert s.accepted <= s.proposed and s.new_tokens == len(r.token_ids) and s.forwards <= s.new_tokens
        assert s.draft_forwards >= 1


@pytest.mark.parametrize("params", [{"context_window": 4, "search_steps": 6},
                                    {"skip_layers": "2,4", "max_draft_tokens": 4}])
def test_search_and_fixed_set_are_lossless_on_a_deeper_model(deep, params):
    ref = fastdecode.generate(deep, PROMPTS, "ar.greedy", max_new_tokens=30)
    out = fastdecode.generate(deep, PROMPTS, "spec.layerskip", max_new_tokens=30, **params)
    assert [r.token_ids for r in out] == [r.token_ids for r in ref]


def test_fixed_set_draft_forwards_equal_proposed_tokens(causal):
    r = fastdecode.generate(causal, PROMPTS[2], "spec.layerskip", skip_layers="1", confidence_stop=0.0,
                            max_draft_tokens=3, max_new_tokens=20)
    assert r.stats.draft_forwards == r.stats.proposed > 0  # one skipped-model forward per draft token, no search


def verified(draft: torch.Tensor, context: torch.Tensor, accepted: int) -> Verification:
    """What the driver tells a chain drafter after verifying `draft`: `accepted` of it, then the target's token
    (the last of `context`); model drafters read only the counts."""
    k = draft.numel()
    return Verification(accepted, tuple(context[-accepted - 1 :].tolist()), torch.zeros(1 + k, 1), k)


def test_search_runs_one_scoring_forward_per_step_then_settles(deep):
    cfg = LayerSkipConfig(context_window=4, search_steps=5, confidence_stop=0.0, max_draft_tokens=2)
    drafter = LayerSkipDrafter(deep, 6, cfg, None)
    assert drafter.skip == frozenset({2, 4})  # 2 of layers 1..4, evenly spread; never the first or last
    context = torch.tensor(deep.encode(PROMPTS[0]))
    steps = 0
    while drafter.search.active:
        before = drafter.forwards
        draft = drafter.propose(context, 10).tokens
        searched = context.numel() - len(deep.encode(PROMPTS[0])) >= 4
        assert drafter.forwards - before == draft.numel() + searched
        # the target "accepts" nothing and emits one token of its own
        context = torch.cat([context, torch.tensor([(int(draft[0]) + 1) % deep.vocab_size])])
        drafter.observe(verified(draft, context, 0))
        assert drafter.cache.length == context.numel() - 1
        steps += 1
    assert len(drafter.search.tried) == 5 and steps == 4 + 5
    assert drafter.skip == drafter.search.best and len(drafter.skip) == 2 and drafter.skip <= {1, 2, 3, 4}
    before = drafter.forwards
    assert drafter.propose(context, 10).tokens.numel() == drafter.forwards - before  # settled: no more scoring


def test_search_tries_distinct_sets_and_stops_at_the_target_score():
    search = SkipSearch(list(range(1, 9)), 3, budget=20, target=0.9)
    seen = []
    while search.active:
        s = search.next()
        assert s not in seen and len(s) == 3 and s <= set(range(1, 9))
        seen.append(s)
        search.record(s, 0.5 if len(seen) < 7 else 0.95)
    assert len(seen) == 7 and search.best == seen[-1] and search.best_score == 0.95
    small = SkipSearch([1, 2, 3], 2, budget=100, target=1.0)  # only 3 sets exist
    while small.active:
        small.record(small.next(), 0.0)
    assert len(small.tried) == 3


def test_drafter_cache_rolls_back_and_skipped_layers_stay_empty(deep):
    cfg = LayerSkipConfig(skip_layers="2,3", confidence_stop=0.0, max_draft_tokens=4)
    drafter = LayerSkipDrafter(deep, 6, cfg, None)
    context = torch.tensor(deep.encode("the quick brown"))
    first = drafter.propose(context, 10).tokens.cpu()  # on a device a greedy draft is left there, unread
    assert first.numel() == 4 and drafter.forwards == 4
    layers = drafter.cache.layers
    assert all(not layers[i].is_initialized for i in (2, 3))  # skipped layers never store anything
    assert all(layers[i].is_initialized for i in (0, 1, 4, 5)) and drafter.cache.length == context.numel() + 3
    # the target accepts two drafts, then corrects the third
    context = torch.cat([context, first[:2], torch.tensor([(int(first[2]) + 1) % deep.vocab_size])])
    drafter.observe(verified(first, context, 2))
    assert drafter.cache.length == context.numel() - 1
    fresh = LayerSkipDrafter(deep, 6, cfg, None)
    assert drafter.propose(context, 10).tokens.tolist() == fresh.propose(context, 10).tokens.tolist()


def test_eos_inside_a_draft_stops_the_row(causal_dir, baseline):
    model = fastdecode.load(causal_dir)
    stop = baseline[2][3]
    model.model.generation_config.eos_token_id = [1, stop]
    ref = fastdecode.generate(model, PROMPTS, "ar.greedy", max_new_tokens=40)
    out = fastdecode.generate(model, PROMPTS, "spec.layerskip", max_new_tokens=40, trace=True, confidence_stop=0.0,
                              max_draft_tokens=6)
    for b, (r, a) in enumerate(zip(out, ref, strict=True)):
        assert r.token_ids == a.token_ids and r.stats.finish_reason == a.stats.finish_reason
        assert [t for e in r.trace for _, t in e.tokens[b]] == r.token_ids  # nothing after the EOS is emitted
    assert out[2].token_ids == baseline[2][:4]


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_max_new_tokens_inside_a_draft(causal, baseline, n):
    out = fastdecode.generate(causal, PROMPTS, "spec.layerskip", max_new_tokens=n, trace=True, confidence_stop=0.0,
                              max_draft_tokens=10, context_window=1)
    for b, r in enumerate(out):
        assert r.token_ids == baseline[b][:n]
        assert sum(len(e.tokens[b]) for e in r.trace) == len(r.token_ids) <= n
        assert r.stats.proposed <= max(n - 1, 0) * r.stats.forwards


def test_seeded_sampling_repeats_and_seeds_differ(deep):
    def run(seed):
        out = fastdecode.generate(deep, PROMPTS, "spec.layerskip", temperature=1.5, seed=seed, max_new_tokens=24,
                                  context_window=4, search_steps=4)
        return [r.token_ids for r in out]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_the_model_is_unchanged_after_runs_and_errors(deep):
    ids = torch.tensor([deep.encode(PROMPTS[3])], device=deep.device)
    pos = torch.arange(ids.shape[1], device=deep.device)[None]
    owner, name = decoder_layers(deep.model)
    layers = getattr(owner, name)
    before = deep.forward(ids, pos)
    fastdecode.generate(deep, PROMPTS, "spec.layerskip", max_new_tokens=12, context_window=2, search_steps=3)
    fastdecode.generate(deep, PROMPTS[0], "spec.layerskip", max_new_tokens=12, temperature=1.0, seed=0)
    with pytest.raises(RuntimeError, match="boom"):
        with skipping(deep, frozenset({1, 2})):
            assert len(getattr(owner, name)) == 4
            raise RuntimeError("boom")
    assert getattr(owner, name) is layers and len(layers) == 6
    assert list(deep.model.model.layers) == list(layers)
    torch.testing.assert_close(deep.forward(ids, pos), before, rtol=0, atol=0)


def test_other_architectures_are_lossless():
    torch.manual_seed(0)
    models = [
        GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=4, n_head=4, n_positions=128, eos_token_id=1)),
        GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                                         intermediate_size=64, max_position_embeddings=128, eos_token_id=1)),
    ]
    for hf in models:
        model = fastdecode.CausalLM(hf.eval())
        prompts = [[5, 6, 7, 8], [9, 10, 11]]
        ref = fastdecode.generate(model, prompts, "ar.greedy", max_new_tokens=20)
        out = fastdecode.generate(model, prompts, "spec.layerskip", max_new_tokens=20, context_window=4, search_steps=3)
        assert [r.token_ids for r in out] == [r.token_ids for r in ref]


@pytest.mark.parametrize("params,match", [
    ({"skip_ratio": 0.0}, "skip_ratio"),
    ({"skip_ratio": 1.5}, "skip_ratio"),
    ({"max_draft_tokens": 0}, "max_draft_tokens"),
    ({"confidence_stop": 1.0}, "confidence_stop"),
    ({"search_steps": -1}, "search_steps"),
    ({"context_window": 0}, "context_window"),
    ({"target_score": 0.0}, "target_score"),
    ({"skip_layers": "0,1"}, "layer 0"),
    ({"skip_layers": "1,1"}, "twice"),
    ({"skip_layers": "one"}, "layer indices separated by commas"),
    ({"skip_layers": "-1"}, "layer indices separated by commas"),
    ({"skip_layers": "1,5"}, r"layers 0\.\.1, so 5 cannot be skipped"),
])
def test_bad_parameters_are_refused(causal, params, match):
    with pytest.raises(ParameterError, match=match):
        fastdecode.generate(causal, "the", "spec.layerskip", max_new_tokens=4, **params)


def test_models_without_skippable_layers_are_refused(causal):
    one = fastdecode.CausalLM(type(causal.model)(causal.model.config.__class__(
        **{**causal.model.config.to_dict(), "num_hidden_layers": 1})))
    with pytest.raises(IncompatibleMethodError, match="at least 2 decoder layers"):
        fastdecode.generate(one, [3, 4], "spec.layerskip", max_new_tokens=4)
    with pytest.raises(IncompatibleMethodError, match="keeps them in none of the known places"):
        decoder_layers(torch.nn.Linear(2, 2))
