"""spec.rsd and spec.dyntree (draft-model trees) on tiny fp32 models: greedy output equals ar.greedy token for
token with a different draft model and with the target drafting for itself (batched, EOS and max_new_tokens
inside a draft); a self-draft's first tree path is accepted in full; the batched tree forwards of the draft
model equal plain forwards; seeded sampled runs repeat."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import fastdecode
from fastdecode.engine import encode_batch
from fastdecode.registry import RunContext
from fastdecode.speculative.drafter import BaseDrafter, Draft, Verification
from fastdecode.speculative.drafters.dyntree import DynTreeConfig, DynTreeDrafter
from fastdecode.speculative.drafters.rsd import RSDConfig, RSDDrafter
from fastdecode.speculative.driver import speculative
from fastdecode.speculative.tree import check_tree, children, depths

PROMPTS = ["the quick brown fox", "def add(a, b):", "Sort this", "0123456789 ABC abc the lazy dog jumps"]
LONG = PROMPTS[2]  # runs 40 tokens without EOS on the tiny model


@pytest.fixture(scope="module")
def small_draft(tmp_path_factory, tokenizer, save_causal_model):
    """A second, smaller random model with the target's tokenizer: it disagrees with the target often."""
    folder = tmp_path_factory.mktemp("tiny-draft")
    return fastdecode.load(save_causal_model(folder, tokenizer, seed=1, num_hidden_layers=1, hidden_size=32,
                                             intermediate_size=64))


@pytest.fixture(scope="module")
def baseline(causal):
    return [r.token_ids for r in fastdecode.generate(causal, PROMPTS, "ar.greedy", max_new_tokens=40)]


CASES = [
    ("spec.rsd", {}),
    ("spec.rsd", {"branches": "3,1,2"}),
    ("spec.rsd", {"branches": "1"}),
    ("spec.dyntree", {}),
    ("spec.dyntree", {"total_tokens": 16, "depth": 5, "width": 3}),
    ("spec.dyntree", {"total_tokens": 4, "depth": 6, "width": 1}),
]


@pytest.mark.parametrize("which", ["small", "self"])
@pytest.mark.parametrize("method,params", CASES)
def test_batched_greedy_equals_ar_greedy(causal, small_draft, baseline, method, params, which):
    draft = causal if which == "self" else small_draft
    results = fastdecode.generate(causal, PROMPTS, method, draft=draft, max_new_tokens=40, **params)
    assert [r.token_ids for r in results] == baseline
    for r in results:
        s = r.stats
        assert s.accepted <= s.proposed and s.new_tokens == len(r.token_ids)
        assert sum(s.accepted_per_position) == s.accepted
        assert s.forwards <= s.new_tokens and s.draft_forwards >= s.forwards - 1  # no draft when one token is left


def first_path(draft: Draft) -> int:
    """Length of the path that always takes a node's first listed child."""
    kids, node, n = children(draft.parents), -1, 0
    while kids[node]:
        node, n = kids[node][0], n + 1
    return n


class Recording(BaseDrafter):
    """Wraps a drafter and keeps its drafts."""

    def __init__(self, inner) -> None:
        self.inner, self.drafts = inner, []
        self.tree_drafts = inner.tree_drafts

    @property
    def forwards(self) -> int:
        return self.inner.forwards

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        self.drafts.append(self.inner.propose(context, k))
        return self.drafts[-1]

    def observe(self, verification: Verification) -> None:
        self.inner.observe(verification)

    def finish(self, context: torch.Tensor) -> None:
        self.inner.finish(context)


@pytest.mark.parametrize("cfg", [RSDConfig(branches="2,2,1"), RSDConfig(), DynTreeConfig(width=1, depth=4),
                                 DynTreeConfig(), DynTreeConfig(total_tokens=20, depth=6, width=3)])
def test_self_draft_accepts_the_first_path_in_full(causal, baseline, cfg):
    """The first child of every node is the draft's argmax; drafting with the target, the target agrees with it.
    RSD's greedy tree is always full depth, so every step emits depth + 1 tokens; dyntree's first path is as
    deep as the ranking kept it (full depth for width 1, a chain)."""
    cfg = dataclasses.replace(cfg, max_new_tokens=40)
    recorder = Recording(RSDDrafter(causal, cfg, None) if isinstance(cfg, RSDConfig) else DynTreeDrafter(causal, cfg))
    batch = encode_batch(causal, [causal.encode(LONG)], cfg.max_new_tokens)
    events = list(speculative(causal, batch, cfg, RunContext(), lambda g: recorder))
    assert [t for e in events for _, t in e.tokens[0]] == baseline[2]
    for event, drafted in zip(events, recorder.drafts, strict=True):
        draft = drafted.on_host()  # (a tree left on a device: read here)
        check_tree(draft.tokens.tolist(), draft.parents)
        assert event.accepted[0] == first_path(draft)
    full_depth = isinstance(cfg, RSDConfig) or cfg.width == 1
    steps = events[:-1]  # the last step is cut short by max_new_tokens
    if full_depth:
        depth = len(cfg.branches.split(",")) if isinstance(cfg, RSDConfig) else cfg.depth
        assert [len(e.tokens[0]) for e in steps] == [depth + 1] * len(steps)
        assert [e.draft_forwards for e in steps] == [depth] * len(steps)  # root + one forward per inner level


def test_rsd_tree_shape_and_forwards(causal):
    drafter = RSDDrafter(causal, RSDConfig(branches="3,2,1"), None)
    d = drafter.propose(torch.tensor(causal.encode("the quick")), 10)
    assert depths(d.parents) == [1] * 3 + [2] * 6 + [3] * 6 and d.probs is None and drafter.forwards == 3
    assert drafter.propose(torch.tensor(causal.encode("the quick brown")), 2).tokens.numel() == 9  # depth capped


def reference_children(model, path: list[int], width: int) -> tuple[list[int], list[float]]:
    """The `width` likeliest next tokens after `path` and their log-probabilities, from one plain forward."""
    ids = torch.tensor(path, device=model.device)[None]
    logq = model.forward(ids, torch.arange(len(path), device=model.device)[None])[0, -1].log_softmax(-1)
    top = logq.topk(width)
    return top.indices.tolist(), top.values.tolist()


def reference_dyntree(model, context: list[int], cfg: DynTreeConfig) -> list[tuple[int, ...]]:
    """EAGLE-2's tree with plain forwards of every path and no early stop: the kept nodes as token paths."""
    nodes: list[tuple[tuple[int, ...], float]] = []  # (token path, score), in creation order
    level = [((), 0.0)]
    for _ in range(cfg.depth):
        new = []
        for path, score in level:
            ids, lq = reference_children(model, context + list(path), cfg.width)
            new += [(path + (x,), score + s) for x, s in zip(ids, lq, strict=True)]
        nodes += new
        order = sorted(range(len(new)), key=lambda i: -new[i][1])
        level = [new[i] for i in order[: cfg.width]]
    ranked = sorted(range(len(nodes)), key=lambda i: (-nodes[i][1], i))[: cfg.total_tokens]
    return [nodes[i][0] for i in sorted(ranked)]


def paths(draft: Draft) -> list[tuple[int, ...]]:
    draft = draft.on_host()  # (a tree left on a device: read here)
    tokens, out = draft.tokens.tolist(), []
    for i, p in enumerate(draft.parents):
        out.append((out[p] if p >= 0 else ()) + (tokens[i],))
    return out


@pytest.mark.parametrize("cfg", [DynTreeConfig(total_tokens=12, depth=4, width=3),
                                 DynTreeConfig(total_tokens=30, depth=3, width=4)])
def test_dyntree_equals_eagle2_built_from_plain_forwards(small_draft, cfg):
    """The batched tree-mask forwards (and the cache kept across steps, and the early stop) change nothing."""
    drafter = DynTreeDrafter(small_draft, cfg)
    context = small_draft.encode("the quick brown fox")
    for extra in ([], [5, 9], [7]):  # later steps reuse the draft cache of the context
        context = context + extra
        assert paths(drafter.propose(torch.tensor(context), 10)) == reference_dyntree(small_draft, context, cfg)


def test_dyntree_without_its_early_stop_equals_eagle2_too(small_draft):
    """Where reading the scores would make the host wait (a GPU), the tree grows every level without the early stop
    (`early_stop=None` there, or False): more draft forwards, the same tree."""
    cfg = DynTreeConfig(total_tokens=12, depth=4, width=3)
    context = small_draft.encode("the quick brown fox")
    here = DynTreeDrafter(small_draft, cfg)
    assert paths(here.propose(torch.tensor(context), 10)) == reference_dyntree(small_draft, context, cfg)
    there = DynTreeDrafter(small_draft, dataclasses.replace(cfg, early_stop=False))
    assert paths(there.propose(torch.tensor(context), 10)) == reference_dyntree(small_draft, context, cfg)
    assert there.forwards == cfg.depth and here.forwards <= there.forwards


def test_rsd_greedy_tree_equals_top_children_from_plain_forwards(small_draft):
    drafter = RSDDrafter(small_draft, RSDConfig(branches="3,2"), None)
    context = small_draft.encode("def add(a, b):")
    for extra in ([], [11, 12, 13]):
        context = context + extra
        expected = []
        first, _ = reference_children(small_draft, context, 3)
        expected += [(x,) for x in first]
        for x in first:
            expected += [(x, y) for y in reference_children(small_draft, context + [x], 2)[0]]
        assert paths(drafter.propose(torch.tensor(context), 10)) == expected


def test_rsd_with_top_k_one_samples_the_greedy_output(causal, baseline):
    """top_k=1 leaves one token of positive probability in every row of q: the second child under each node is not
    drawn (`gumbel_top_k`) and must never be accepted; p is one-hot too, so sampling gives ar.greedy's tokens."""
    out = fastdecode.generate(causal, PROMPTS, "spec.rsd", draft=causal, max_new_tokens=40, temperature=1.0, top_k=1,
                              seed=0)
    assert [r.token_ids for r in out] == baseline
    assert all(r.stats.accepted > 0 for r in out)


def test_rsd_sampled_draft_carries_q(small_draft):
    g = torch.Generator(device=small_draft.device).manual_seed(0)
    drafter = RSDDrafter(small_draft, RSDConfig(branches="3,2", temperature=1.0, top_k=5), g)
    d = drafter.propose(torch.tensor(small_draft.encode("the quick")), 10)
    assert d.probs.shape == (9, small_draft.vocab_size)
    torch.testing.assert_close(d.probs.sum(-1), torch.ones(9, device=d.probs.device))
    assert (d.probs > 0).sum(-1).max() <= 5  # the target's processors apply to q
    check_tree(d.tokens.tolist(), d.parents)
    for i, p in enumerate(d.parents):
        assert d.probs[i, d.tokens[i]] > 0
        if i > 0 and p == d.parents[i - 1]:
            assert torch.equal(d.probs[i], d.probs[i - 1])  # siblings share their parent's q


@pytest.mark.parametrize("method,params", [("spec.rsd", {}), ("spec.dyntree", {}), ("spec.dyntree", {"width": 1})])
def test_eos_inside_a_draft_stops_the_row(causal_dir, baseline, method, params):
    model = fastdecode.load(causal_dir)
    stop = baseline[2][3]  # 4th token of the first path of the first tree (for rsd and the dyntree chain)
    model.model.generation_config.eos_token_id = [1, stop]
    ref = fastdecode.generate(model, PROMPTS, "ar.greedy", max_new_tokens=40)
    out = fastdecode.generate(model, PROMPTS, method, draft=model, max_new_tokens=40, trace=True, **params)
    for b, (r, a) in enumerate(zip(out, ref, strict=True)):
        assert r.token_ids == a.token_ids and r.stats.finish_reason == a.stats.finish_reason
        assert [t for e in r.trace for _, t in e.tokens[b]] == r.token_ids  # nothing after the EOS is emitted
    if method == "spec.rsd" or params:  # the first path is 5 (rsd) or 8 (chain) deep and accepted in full
        row = fastdecode.generate(model, PROMPTS[2], method, draft=model, max_new_tokens=40, **params)
        assert row.token_ids == baseline[2][:4] and row.stats.forwards == 1 and row.stats.accepted == 4


@pytest.mark.parametrize("n", [1, 2, 3, 7])
@pytest.mark.parametrize("method", ["spec.rsd", "spec.dyntree"])
def test_max_new_tokens_inside_a_draft(causal, small_draft, baseline, method, n):
    for draft in (causal, small_draft):
        out = fastdecode.generate(causal, PROMPTS, method, draft=draft, max_new_tokens=n, trace=True)
        for b, r in enumerate(out):
            assert r.token_ids == baseline[b][:n]
            assert sum(len(e.tokens[b]) for e in r.trace) == len(r.token_ids) <= n


@pytest.mark.parametrize("method,params", [("spec.rsd", {}), ("spec.dyntree", {"total_tokens": 16})])
def test_seeded_sampling_repeats_and_seeds_differ(causal, small_draft, method, params):
    run = lambda seed: [r.token_ids for r in fastdecode.generate(  # noqa: E731
        causal, PROMPTS, method, draft=small_draft, temperature=1.5, seed=seed, max_new_tokens=24, **params)]
    assert run(7) == run(7)
    assert run(7) != run(8)
    g1, g2 = (torch.Generator(device=causal.device).manual_seed(3) for _ in range(2))
    a = fastdecode.generate(causal, LONG, method, draft=causal, generator=g1, temperature=2.0, max_new_tokens=16)
    b = fastdecode.generate(causal, LONG, method, draft=causal, generator=g2, temperature=2.0, max_new_tokens=16)
    assert a.token_ids == b.token_ids
