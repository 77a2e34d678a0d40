"""Speculative methods on tiny fp32 models: greedy output equals ar.greedy token for token, batched equals
one-by-one, EOS and max_new_tokens cut inside a draft, and a drafter identical to the target is accepted k+1."""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch
from transformers import LlamaForCausalLM, MistralConfig, MistralForCausalLM

import fastdecode
from fastdecode.engine import encode_batch
from fastdecode.errors import IncompatibleMethodError, ParameterError
from fastdecode.models.host_ops import HostOps
from fastdecode.registry import RunContext
from fastdecode.speculative.drafter import BaseDrafter, Draft, SpecConfig, Verification
from fastdecode.speculative.drafters.draft_model import DraftModelConfig, ModelDrafter
from fastdecode.speculative.drafters.recycling import RecyclingConfig, template_nodes
from fastdecode.speculative.driver import speculative
from fastdecode.speculative.memory import DrafterMemory, forget, memory_of
from fastdecode.speculative.model_chain import ModelChainDrafter
from fastdecode.speculative.tree import depths

PROMPTS = ["the quick brown fox", "def add(a, b):", "Sort this", "0123456789 ABC abc the lazy dog jumps"]
LONG = PROMPTS[2]  # runs 40 tokens without EOS on the tiny model


@pytest.fixture(scope="module")
def other_draft(causal, to_device):
    """A different random model with the target's shape and tokenizer: it disagrees with the target often."""
    with torch.random.fork_rng():
        torch.manual_seed(1)
        twin = LlamaForCausalLM(causal.model.config).eval()
    with torch.no_grad():
        twin.lm_head.weight.mul_(8.0)  # as sharp as the target (conftest.save_causal)
    return fastdecode.CausalLM(to_device(twin), causal.tokenizer, name="tiny-draft")


@pytest.fixture(scope="module")
def baseline(causal):
    return [r.token_ids for r in fastdecode.generate(causal, PROMPTS, "ar.greedy", max_new_tokens=40)]


# (method, params, which draft: None / "self" / "other"); every lossless method with its defaults (and a
# different random draft model) is in test_lossless_registry.py
CASES = [
    ("spec.pld", {"max_ngram": 1, "num_tokens": 3}, None),
    ("spec.ngram", {"min_n": 2, "max_n": 4, "num_tokens": 8}, None),
    ("spec.draft_model", {"num_draft_tokens": 3}, "self"),
    ("spec.draft_model", {"schedule": "heuristic", "confidence_stop": 0.4}, "other"),
    ("spec.draft_model", {"confidence_stop": 0.4, "adaptive_stop": True, "num_draft_tokens": 8}, "other"),
    ("spec.draft_model", {"schedule": "heuristic", "num_draft_tokens": 2}, "self"),
    ("spec.suffix", {"max_cached_requests": 0}, None),
    ("spec.suffix", {"max_depth": 8, "max_spec_factor": 2.0, "min_token_prob": 0.0}, None),
    ("spec.suffix", {"tree": True, "max_spec_factor": 3.0, "min_token_prob": 0.0}, None),
    ("spec.jacobi", {"window": 2}, None),
    ("spec.recycling", {"top_k_candidates": 2, "template": "1,1,1"}, None),
    ("spec.lookahead", {"ngram": 3, "window": 4, "guesses": 2}, None),
    ("spec.eagle3", {"num_draft_tokens": 3}, None),  # the random head conftest attaches
    ("spec.eagle3", {"tree": True, "total_tokens": 8, "width": 3}, None),
]


def drafts(case_draft, causal, other_draft):
    return {} if case_draft is None else {"draft": causal if case_draft == "self" else other_draft}


@pytest.mark.parametrize("method,params,draft", CASES)
def test_batched_greedy_equals_ar_greedy(causal, other_draft, baseline, method, params, draft):
    kw = dict(params, **drafts(draft, causal, other_draft))
    results = fastdecode.generate(causal, PROMPTS, method, max_new_tokens=40, **kw)
    assert [r.token_ids for r in results] == baseline
    for r in results:
        s = r.stats
        assert s.accepted <= s.proposed and s.new_tokens == len(r.token_ids)
        assert sum(s.accepted_per_position) == s.accepted
        assert s.forwards <= s.new_tokens


@pytest.mark.parametrize("method", ["spec.suffix", "spec.recycling"])
def test_drafters_learn_from_earlier_requests_and_stay_lossless(causal, baseline, method):
    """spec.suffix's global tree and spec.recycling's matrix outlive a request; `forget` empties them."""
    forget(causal)
    first = fastdecode.generate(causal, PROMPTS, method, max_new_tokens=40)
    again = fastdecode.generate(causal, PROMPTS, method, max_new_tokens=40)
    assert [r.token_ids for r in first] == [r.token_ids for r in again] == baseline
    assert sum(r.stats.forwards for r in again) < sum(r.stats.forwards for r in first)
    forget(causal)
    fresh = fastdecode.generate(causal, PROMPTS, method, max_new_tokens=40)
    assert [r.stats.forwards for r in fresh] == [r.stats.forwards for r in first]
    forget(causal)


@pytest.mark.parametrize("method", ["spec.suffix", "spec.recycling"])
def test_a_memory_passed_to_generate_is_what_the_run_learns_from(causal, baseline, method):
    """generate(..., memory=m): the run reads and extends m only; the model's own memory stays as it was."""
    def run(**kw):
        out = fastdecode.generate(causal, PROMPTS, method, max_new_tokens=40, **kw)
        assert [r.token_ids for r in out] == baseline
        return [r.stats.forwards for r in out]

    forget(causal)
    mine = DrafterMemory()
    first = run(memory=mine)
    assert len(mine) == 1 and len(memory_of(causal)) == 0
    assert sum(run(memory=mine)) < sum(first)  # learnt from the first run
    assert run(memory=DrafterMemory()) == first == run()  # a fresh memory, or the model's own (empty) one
    mine.clear()
    assert run(memory=mine) == first
    forget(causal)


def test_recycling_without_a_shared_matrix_starts_every_request_empty(causal, baseline):
    forget(causal)
    first = fastdecode.generate(causal, PROMPTS, "spec.recycling", max_new_tokens=40, shared_matrix=False)
    again = fastdecode.generate(causal, PROMPTS, "spec.recycling", max_new_tokens=40, shared_matrix=False)
    assert [r.token_ids for r in again] == baseline
    assert [r.stats.forwards for r in again] == [r.stats.forwards for r in first]


def test_recycling_sampled_runs_repeat_from_the_same_matrix(causal):
    """A seeded sampled run repeats: after `forget`, without sharing, and (since it starts from an empty matrix of
    its own: tests/invariants/test_seeded_memory.py) after other runs filled the shared one."""
    def run(**kw):
        return [r.token_ids for r in fastdecode.generate(causal, PROMPTS, "spec.recycling", temperature=1.5, seed=5,
                                                          max_new_tokens=24, **kw)]
    forget(causal)
    first = run()
    forget(causal)
    assert run() == first
    assert run(shared_matrix=False) == run(shared_matrix=False)
    forget(causal)


def test_batched_stats_equal_one_by_one(causal, other_draft):
    batched = fastdecode.generate(causal, PROMPTS, "spec.draft_model", draft=other_draft, max_new_tokens=30)
    for prompt, b in zip(PROMPTS, batched, strict=True):
        s = fastdecode.generate(causal, prompt, "spec.draft_model", draft=other_draft, max_new_tokens=30)
        assert b.token_ids == s.token_ids
        assert (b.stats.forwards, b.stats.proposed, b.stats.accepted, b.stats.accepted_per_position) == (
            s.stats.forwards, s.stats.proposed, s.stats.accepted, s.stats.accepted_per_position)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_draft_identical_to_target_is_accepted_k_plus_one(causal, k):
    steps = 3
    events = list(fastdecode.stream(causal, LONG, "spec.draft_model", draft=causal, num_draft_tokens=k,
                                    max_new_tokens=steps * (k + 1)))
    r = events[-1].results[0]
    assert r.stats.finish_reason == "length"
    assert [len(e.tokens[0]) for e in events[:-1]] == [k + 1] * steps
    assert r.stats.forwards == steps and r.stats.tokens_per_forward == k + 1
    assert r.stats.accepted_per_position == [steps] * k
    assert r.stats.draft_forwards == steps * k


def test_eos_inside_a_draft_stops_the_row(causal_dir, baseline):
    model = fastdecode.load(causal_dir)
    stop = baseline[2][3]  # inside the first draft of 5 (accepted in full by the self-draft)
    model.model.generation_config.eos_token_id = [1, stop]
    ref = fastdecode.generate(model, PROMPTS, "ar.greedy", max_new_tokens=40)
    for method, kw in [("spec.draft_model", {"draft": model}), ("spec.pld", {}), ("spec.ngram", {}),
                       ("spec.suffix", {}), ("spec.jacobi", {}), ("spec.recycling", {}), ("spec.lookahead", {})]:
        out = fastdecode.generate(model, PROMPTS, method, max_new_tokens=40, trace=True, **kw)
        for b, (r, a) in enumerate(zip(out, ref, strict=True)):
            assert r.token_ids == a.token_ids and r.stats.finish_reason == a.stats.finish_reason
            streamed = [t for e in r.trace for _, t in e.tokens[b]]
            assert streamed == r.token_ids  # nothing after the EOS is ever emitted
    row = fastdecode.generate(model, PROMPTS[2], "spec.draft_model", draft=model, max_new_tokens=40)
    assert row.token_ids == baseline[2][:4] and row.stats.forwards == 1 and row.stats.accepted == 4


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_max_new_tokens_inside_a_draft(causal, baseline, n):
    for method, kw in [("spec.draft_model", {"draft": causal}), ("spec.pld", {"num_tokens": 10}), ("spec.suffix", {}),
                       ("spec.suffix", {"tree": True}), ("spec.recycling", {}), ("spec.lookahead", {"ngram": 3})]:
        out = fastdecode.generate(causal, PROMPTS, method, max_new_tokens=n, trace=True, **kw)
        # a chain (or a suffix tree, whose node budget is the room) drafts at most n - 1 tokens per forward;
        # recycling at most the nodes of its template that deep
        per_forward = max(n - 1, 0) if method != "spec.recycling" else sum(
            d <= n - 1 for d in depths([p for p, _ in template_nodes(RecyclingConfig().template, 8)]))
        for b, r in enumerate(out):
            assert r.token_ids == baseline[b][:n]
            assert sum(len(e.tokens[b]) for e in r.trace) == len(r.token_ids) <= n
            assert r.stats.proposed <= per_forward * r.stats.forwards


def test_seeded_sampling_repeats_and_seeds_differ(causal, other_draft):
    for method, kw in [("spec.draft_model", {"draft": other_draft}), ("spec.pld", {}), ("spec.lookahead", {})]:
        def run(seed, method=method, kw=kw):
            return [r.token_ids for r in fastdecode.generate(
                causal, PROMPTS, method, temperature=1.5, seed=seed, max_new_tokens=24, **kw)]
        assert run(7) == run(7)
        assert run(7) != run(8)
    g1, g2 = (torch.Generator(device=causal.device).manual_seed(3) for _ in range(2))
    a = fastdecode.generate(causal, LONG, "spec.ngram", generator=g1, temperature=2.0, max_new_tokens=16)
    b = fastdecode.generate(causal, LONG, "spec.ngram", generator=g2, temperature=2.0, max_new_tokens=16)
    assert a.token_ids == b.token_ids


def test_missing_or_mismatched_draft_is_refused(causal, tokenizer):
    with pytest.raises(IncompatibleMethodError, match="needs a draft model"):
        fastdecode.generate(causal, "the", "spec.draft_model")
    small = LlamaForCausalLM(causal.model.config.__class__(**{**causal.model.config.to_dict(), "vocab_size": 100}))
    with pytest.raises(IncompatibleMethodError, match="same tokenizer"):
        fastdecode.generate(causal, "the", "spec.draft_model", draft=fastdecode.CausalLM(small))
    with pytest.raises(ParameterError):
        fastdecode.generate(causal, "the", "spec.draft_model", draft=causal, schedule="sometimes")


@pytest.mark.parametrize("method", ["spec.pld", "spec.ngram", "spec.recycling", "spec.lookahead"])
def test_sliding_window_model_runs_speculative_methods(method, to_device):
    """A window shorter than prompt and output: the attention plan applies it to drafted and tree tokens alike, and
    the rolled-back cache keeps every key, so the output is ar.greedy's and transformers' own."""
    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, initializer_range=0.3,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=6, max_position_embeddings=256)
    module = to_device(MistralForCausalLM(cfg).eval())
    model = fastdecode.CausalLM(module)
    prompt = [3, 4, 5, 6, 3, 4, 5, 6, 7, 3, 4]
    base = fastdecode.generate(model, prompt, "ar.greedy", max_new_tokens=24).token_ids
    hf = module.generate(torch.tensor([prompt], device=model.device), do_sample=False, max_new_tokens=24,
                         min_new_tokens=24, pad_token_id=0)[0, len(prompt):].tolist()
    assert base == hf[: len(base)]
    assert fastdecode.generate(model, prompt, method, max_new_tokens=24).token_ids == base


def verified(draft: torch.Tensor, context: torch.Tensor, accepted: int) -> Verification:
    """What the driver tells a chain drafter after verifying `draft`: `accepted` of it, then the target's token
    (the last of `context`); model drafters read only the counts."""
    k = draft.numel()
    return Verification(accepted, tuple(context[-accepted - 1 :].tolist()), torch.zeros(1 + k, 1), k)


def test_draft_cache_rolls_back_to_the_accepted_prefix(other_draft):
    greedy = DraftModelConfig(num_draft_tokens=4)
    drafter = ModelDrafter(other_draft, greedy, None)
    context = torch.tensor(other_draft.encode("the quick brown"))
    first = drafter.propose(context, 10).tokens.cpu()  # on a device a greedy draft is left there, unread
    assert first.numel() == 4 and drafter.forwards == 4
    # the target accepts two drafts, then corrects the third
    context = torch.cat([context, first[:2], torch.tensor([(int(first[2]) + 1) % other_draft.vocab_size])])
    drafter.observe(verified(first, context, 2))
    assert drafter.cache.length == context.numel() - 1
    fresh = ModelDrafter(other_draft, greedy, None)
    assert drafter.propose(context, 10).tokens.tolist() == fresh.propose(context, 10).tokens.tolist()


def test_heuristic_schedule_grows_and_shrinks(other_draft):
    drafter = ModelDrafter(other_draft, DraftModelConfig(num_draft_tokens=3, schedule="heuristic"), None)
    context = torch.tensor(other_draft.encode("the quick brown"))
    lengths = []
    for accepted_all in (True, True, False, False, False, False):
        d = drafter.propose(context, 100).tokens.cpu()  # (left on a device unread)
        accepted = d.numel() if accepted_all else 0
        context = torch.cat([context, d[:accepted], torch.tensor([5])])
        drafter.observe(verified(d, context, accepted))
        lengths.append(drafter.length)
    assert lengths == [5, 7, 6, 5, 4, 3]


def test_confidence_stop_cuts_the_draft_after_an_unsure_token(other_draft):
    context = torch.tensor(other_draft.encode("the quick brown"))
    sure = ModelDrafter(other_draft, DraftModelConfig(num_draft_tokens=6), None)
    unsure = ModelDrafter(other_draft, DraftModelConfig(num_draft_tokens=6, confidence_stop=0.999999), None)
    full, cut = sure.propose(context, 100).tokens, unsure.propose(context, 100).tokens
    assert full.numel() == 6 and cut.tolist() == full[:1].tolist() and unsure.forwards == 1


class OracleTree(BaseDrafter):
    """A tree whose true branch (the greedy output) always comes second, after a decoy, at every depth."""

    def __init__(self, truth: list[int], prompt_len: int, depth: int, vocab: int) -> None:
        self.truth, self.prompt_len, self.depth, self.vocab = truth, prompt_len, depth, vocab

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        made = context.numel() - self.prompt_len
        true = self.truth[made : made + min(k, self.depth)]
        tokens, parents, above = [], [], -1
        for t in true:
            tokens += [(t + 1) % self.vocab, t]
            parents += [above, above]
            above = len(tokens) - 1
        return Draft(torch.tensor(tokens, dtype=torch.long), parents=parents)


def test_tree_attention_accepts_the_full_true_path(causal, baseline):
    prompt = causal.encode(LONG)
    batch = encode_batch(causal, [prompt], 40)
    cfg = SpecConfig(max_new_tokens=40)
    events = list(speculative(causal, batch, cfg, RunContext(),
                              lambda g: OracleTree(baseline[2], len(prompt), 3, causal.vocab_size)))
    assert [t for e in events for _, t in e.tokens[0]] == baseline[2]
    assert [e.accepted[0] for e in events] == [3] * 10  # every step: depth 3 accepted + 1 from the target
    assert [len(e.tokens[0]) for e in events] == [4] * 10


def test_lookahead_near_the_last_position(causal):
    prompt = causal.encode(" ".join(PROMPTS * 3))[:100]
    n = causal.max_positions - len(prompt)  # generation ends at the model's last position
    ref = fastdecode.generate(causal, prompt, "ar.greedy", max_new_tokens=n)
    assert fastdecode.generate(causal, prompt, "spec.lookahead", max_new_tokens=n).token_ids == ref.token_ids


def test_time_split_covers_drafting_and_verification(causal, other_draft):
    """draft_s and verify_s are measured per row and fit inside the wall time; model-free drafters cost little."""
    for method, draft in (("spec.draft_model", other_draft), ("spec.pld", None)):
        for r in fastdecode.generate(causal, PROMPTS[:2], method, max_new_tokens=16, draft=draft):
            s = r.stats
            assert s.verify_s > 0 and s.draft_s > 0
            assert s.draft_s + s.verify_s <= s.wall_s
    greedy = fastdecode.generate(causal, PROMPTS[0], "ar.greedy", max_new_tokens=8).stats
    assert greedy.draft_s == greedy.verify_s == 0.0  # not a speculative method: nothing to split


class _FakeEvent:
    """torch.cuda.Event's part the driver uses, on the host clock, checking the order a real event needs: recorded
    before it is waited for, waited for before its time is read."""

    made = 0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at: float | None = None
        self.waited = False
        _FakeEvent.made += 1

    def record(self, stream: object) -> None:
        assert stream == "the model's stream"
        self.at = time.perf_counter()

    def synchronize(self) -> None:
        assert self.at is not None
        self.waited = True

    def elapsed_time(self, end: _FakeEvent) -> float:
        assert self.at is not None and end.at is not None and end.waited
        return (end.at - self.at) * 1000.0


def test_the_time_split_on_cuda_comes_from_events_not_from_synchronising(causal, other_draft, monkeypatch, device):
    """On CUDA the driver marks its phases with events on the model's stream and reads their times once a step's
    verdict is back, so a step synchronises the host with the device only where it reads the verdict (issue #30).
    Here the CUDA path runs on the CPU with events that keep the host's clock and check their order of use; on a GPU
    (FASTDECODE_TEST_DEVICE=cuda) the next test runs it for real."""
    if device.type == "cuda":
        pytest.skip("on a GPU the next test runs the events themselves")
    from fastdecode.speculative import driver

    class CudaWatch(driver._Stopwatch):
        def __init__(self, device: torch.device) -> None:
            super().__init__(device)
            self.cuda = True

    monkeypatch.setattr(driver, "_Stopwatch", CudaWatch)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: "the model's stream")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("the driver synchronised the device"))
    for method, draft in (("spec.draft_model", other_draft), ("spec.pld", None)):
        made = _FakeEvent.made
        for r in fastdecode.generate(causal, PROMPTS[:2], method, max_new_tokens=16, draft=draft):
            s = r.stats
            assert s.verify_s > 0 and s.draft_s > 0 and s.draft_s + s.verify_s <= s.wall_s
        assert _FakeEvent.made > made  # (the events ran, not the host clock)


def test_a_speculative_generation_on_cuda_synchronises_no_more_than_greedy(causal, device, monkeypatch):
    """On a GPU: with the model warm, fastdecode's code calls torch.cuda.synchronize no more often in a spec.pld
    generation than in an ar.greedy one (the engine's clock, at a generation's start and end), and the time is still
    split. (A graph capture synchronises inside torch: not counted.)"""
    if device.type != "cuda":
        pytest.skip("CUDA's synchronisation: run with FASTDECODE_TEST_DEVICE=cuda")
    real = torch.cuda.synchronize
    package = os.path.dirname(fastdecode.__file__) + os.sep
    calls: list[str] = []

    def counted(*args: object) -> None:
        caller = sys._getframe(1).f_code.co_filename
        if caller.startswith(package):
            calls.append(caller)
        real(*args)

    monkeypatch.setattr(torch.cuda, "synchronize", counted)
    counts = {}
    for method in ("ar.greedy", "spec.pld"):
        fastdecode.generate(causal, PROMPTS[2], method, max_new_tokens=24)  # captures, compiles
        calls.clear()
        r = fastdecode.generate(causal, PROMPTS[2], method, max_new_tokens=24)
        counts[method] = len(calls)
    assert counts["spec.pld"] <= counts["ar.greedy"], counts
    assert r.stats.verify_s > 0 and r.stats.draft_s > 0 and r.stats.draft_s + r.stats.verify_s <= r.stats.wall_s



def test_model_drafters_stop_drafting_at_end_of_text(causal):
    """A drafted EOS ends the output: tokens after it could never be emitted. On the CPU drafting stops there
    (drafting on wastes forwards); on a device the loop, greedy or sampled, reads no token (each read is a
    synchronisation), runs the k forwards asked and leaves the chain to the verification, whose one read ends the
    output at the EOS. Both paths are run here whatever the test device."""
    eos = min(causal.eos_token_ids)

    class EosFirst:  # the tiny model, except that its second draft token is EOS
        eos_token_ids, device, calls = causal.eos_token_ids, causal.device, 0

        def new_cache(self):
            return causal.new_cache()

        def forward(self, *args, **kwargs):
            logits = causal.forward(*args, **kwargs).clone()
            self.calls += 1
            if self.calls == 2:
                logits[..., eos] = 1e4
            return logits

    drafter = ModelDrafter(EosFirst(), DraftModelConfig(num_draft_tokens=6), None)
    drafter.read_each_token = True  # the CPU's path, on any device: each token read, the draft cut at the EOS
    draft = drafter.propose(torch.tensor([0, 5, 6, 7]), 6)
    assert draft.tokens.numel() == 2 and draft.tokens[-1] == eos
    assert drafter.forwards == 2
    # the GPU's path on any device: the k forwards asked, the drafts left unread where the model is (the
    # verification reads them with its verdict; settling the step ends the output at the EOS)
    unread = ModelDrafter(EosFirst(), DraftModelConfig(num_draft_tokens=6), None)
    unread.read_each_token = False
    with HostOps() as count:
        draft = unread.propose(torch.tensor([0, 5, 6, 7]), 6)
    assert count.reads == 0
    assert draft.tokens.numel() == 6 and draft.tokens.device == causal.device and draft.tokens[1] == eos
    assert unread.forwards == 6
    assert unread.cache.length == 4 + 5  # the context and the 5 fed drafts; `observe` drops the rejected ones
    unread.observe(Verification(accepted=1, tokens=(), logits=torch.zeros(0), num_draft=6))
    assert unread.cache.length == 4 + 1  # the context and x_1
    # sampling, the same: the draws and the q each came from stay where the model is
    g = torch.Generator(device=causal.device).manual_seed(0)
    sampled = ModelDrafter(EosFirst(), DraftModelConfig(num_draft_tokens=6, temperature=1.0), g)
    sampled.read_each_token = False
    with HostOps() as count:
        draft = sampled.propose(torch.tensor([0, 5, 6, 7]), 6)
    assert count.reads == 0
    assert draft.tokens.numel() == 6 and draft.tokens[1] == eos and draft.probs.shape == (6, causal.vocab_size)
    assert torch.allclose(draft.probs.sum(-1), torch.ones(6, device=draft.probs.device))


def test_draft_model_without_per_token_reads_equals_greedy(causal, other_draft, monkeypatch):
    """spec.draft_model with the GPU's drafting loop (the drafts unread until the verification reads them with its
    verdict) is still ar.greedy's output, in a batch and one by one, and past an end of text."""
    monkeypatch.setattr(ModelChainDrafter, "read_each_token", False)
    want = [r.token_ids for r in fastdecode.generate(causal, PROMPTS, "ar.greedy", max_new_tokens=24)]
    got = fastdecode.generate(causal, PROMPTS, "spec.draft_model", max_new_tokens=24, draft=other_draft,
                              num_draft_tokens=5)
    assert [r.token_ids for r in got] == want
    for prompt, tokens in zip(PROMPTS, want, strict=True):
        one = fastdecode.generate(causal, prompt, "spec.draft_model", max_new_tokens=24, draft=other_draft,
                                  num_draft_tokens=5)
        assert one.token_ids == tokens
