"""A best-first draft tree grown in one graph (`DraftModelTree.best_first`, spec.dyntree's default where the draft model
runs CUDA graphs; docs/gpu.md "A best-first tree in one graph"): the same tree, the same draft cache, so the same
tokens, forwards and draft forwards as the level-by-level growth without an early stop, greedy and seeded at a
temperature, on the host and on the simulated device; far fewer host operations; a capture that fails warns once
and grows level by level. The graphs run capture-free here (`graphs="replay"`, or an emulated capture), and are
captured under FASTDECODE_TEST_DEVICE=cuda."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from device_sim import emulated_capture, reads_per_forward, simulated

import fastdecode
from fastdecode.errors import FastDecodeWarning, ParameterError
from fastdecode.models import graphs as graphs_module
from fastdecode.models.exact import Exact
from fastdecode.models.host_ops import HostOps
from fastdecode.speculative import model_tree, step_graph
from fastdecode.speculative.model_tree import DraftModelTree
from fastdecode.speculative.step_graph import StepGraphs
from fastdecode.speculative.tree import DeviceTree

PROMPTS = ["the quick brown fox", "Sort this", "def add(a, b):"]
TREE = {"width": 3, "depth": 5, "total_tokens": 16}  # a beam of 3 fits exact mode's block of 8


@pytest.fixture(scope="module")
def models(causal_dir, tmp_path_factory, tokenizer, save_causal_model, load_model, device):
    mode = "cuda" if device.type == "cuda" else "replay"
    folder = save_causal_model(tmp_path_factory.mktemp("tiny-tree-draft"), tokenizer, seed=1, num_hidden_layers=1,
                               hidden_size=32, intermediate_size=64)
    return (load_model(causal_dir, exact=8, graphs=mode), load_model(folder, exact=8, graphs=mode), folder)


@pytest.fixture
def grown(monkeypatch):
    """How many trees `best_first` grew in a graph (it returns None where it cannot)."""
    count = {"graphed": 0, "asked": 0}
    original = DraftModelTree.best_first

    def spy(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        count["asked"] += 1
        count["graphed"] += out is not None
        return out
    monkeypatch.setattr(DraftModelTree, "best_first", spy)
    return count


def _run(target, draft, prompt, graph: bool, new: int = 32, **kw):
    out = fastdecode.generate(target, prompt, "spec.dyntree", draft=draft, max_new_tokens=new, graph=graph,
                              **({} if graph else {"early_stop": False}), **kw)
    return out.token_ids, out.stats.forwards, out.stats.draft_forwards, out.stats.accepted, out.stats.proposed


@pytest.mark.parametrize("params", [TREE, {"width": 2, "depth": 8, "total_tokens": 10}, {**TREE, "depth": 2}])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_tree_grown_in_one_graph_equals_the_levels(models, grown, params, temperature):
    target, draft, _ = models
    sampled = {"temperature": temperature, "seed": 5} if temperature else {}
    for prompt in PROMPTS:
        assert _run(target, draft, prompt, True, **params, **sampled) == \
            _run(target, draft, prompt, False, **params, **sampled)
    # every step after the first (whose draft cache allocates its storage) grew its tree in the graph
    assert grown["graphed"] >= grown["asked"] - len(PROMPTS) > 0


def test_greedy_in_one_graph_equals_ar_greedy(models, grown):
    target, draft, _ = models
    base = fastdecode.generate(target, PROMPTS, "ar.greedy", max_new_tokens=32)
    out = fastdecode.generate(target, PROMPTS, "spec.dyntree", draft=draft, max_new_tokens=32, graph=True, **TREE)
    assert [r.token_ids for r in out] == [r.token_ids for r in base]
    assert grown["graphed"] > 0


def test_where_no_graph_fits_the_tree_grows_by_levels(models, grown):
    """A beam wider than exact mode's block (10 > 8), or a tree of one level: `best_first` declines, same tokens."""
    target, draft, _ = models
    for params in ({"width": 10, "depth": 4, "total_tokens": 30}, {**TREE, "depth": 1}):
        declined = fastdecode.generate(target, PROMPTS[1], "spec.dyntree", draft=draft, max_new_tokens=32,
                                       graph=True, **params)  # (the levels as without graph=: early_stop's default)
        levels = fastdecode.generate(target, PROMPTS[1], "spec.dyntree", draft=draft, max_new_tokens=32, **params)
        assert (declined.token_ids, declined.stats.draft_forwards) == (levels.token_ids, levels.stats.draft_forwards)
    assert grown["asked"] > 0 and grown["graphed"] == 0


def test_a_draft_cache_that_grows_captures_its_tree_again(models, monkeypatch, load_model, device):
    """Key columns in blocks of 16: the draft cache's storage grows every few steps, which retires its graphs (their
    addresses are gone); that step grows by levels (the storage is allocated there) and the next captures anew."""
    _, _, folder = models
    mode = "cuda" if device.type == "cuda" else "replay"
    target = load_model(folder, exact=Exact(8, 16), graphs=mode)
    draft = load_model(folder, exact=Exact(8, 16), graphs=mode)
    captures = []
    original = DraftModelTree.best_first

    def spy(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        captures.append(self.graphs.stats["captures"])
        return out
    monkeypatch.setattr(DraftModelTree, "best_first", spy)
    # (early_stop=False: the step that grows by levels as a device would, not with the host's early stop)
    assert _run(target, draft, PROMPTS[1], True, 64, early_stop=False, **TREE) == \
        _run(target, draft, PROMPTS[1], False, 64, **TREE)
    assert max(captures) >= 3


def test_the_graph_replaces_most_host_operations(models):
    target, draft, _ = models
    fastdecode.generate(target, PROMPTS[1], "spec.dyntree", draft=draft, max_new_tokens=32, graph=True, **TREE)
    ops = {}
    for graph in (True, False):
        with HostOps() as count:
            _run(target, draft, PROMPTS[1], graph, **TREE)
        ops[graph] = count.ops
    assert ops[True] < ops[False] / 2, ops


def test_on_the_simulated_device_the_tree_stays_there_and_equals_the_levels(models, grown, device):
    """On a device the kept tree goes to the verification unread (a `tree.DeviceTree`); one read a step."""
    if device.type != "cpu":
        pytest.skip("the simulation runs on the CPU")
    _, _, folder = models
    with simulated():
        target = fastdecode.load(folder, device="cpu:0", exact=8, graphs="replay")  # (self-drafting: long paths)
        draft = fastdecode.load(folder, device="cpu:0", exact=8, graphs="replay")
        for temperature in (0.0, 1.0):
            kw = {**TREE, **({"temperature": temperature, "seed": 2} if temperature else {})}
            assert _run(target, draft, PROMPTS[0], True, **kw) == _run(target, draft, PROMPTS[0], False, **kw)
            per, forwards, _ = reads_per_forward(lambda new, kw=kw: fastdecode.generate(
                target, PROMPTS[0], "spec.dyntree", draft=draft, max_new_tokens=new, graph=True, **kw))
            assert forwards > 0 and per["waits"] == 1.0, per  # the verdict's read: the tree comes with it
    assert grown["graphed"] > 0


def test_emulated_captures_give_the_same_tokens_and_a_failed_one_warns_once(models, monkeypatch, grown):
    target, draft, _ = models
    want = [_run(target, draft, p, False, **TREE) for p in PROMPTS]
    monkeypatch.setattr(graphs_module, "capture", emulated_capture)
    monkeypatch.setattr(step_graph, "capture", emulated_capture)
    monkeypatch.setattr(draft.graphs, "mode", "cuda")
    monkeypatch.setattr(target.graphs, "mode", "cuda")
    draft.graphs.pool.clear()  # (replay mode's bundles hold no graphs to replay)
    target.graphs.pool.clear()
    assert [_run(target, draft, p, True, **TREE) for p in PROMPTS] == want
    assert grown["graphed"] > 0

    def fails(body, cache, device):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")
    monkeypatch.setattr(step_graph, "capture", fails)
    shared = StepGraphs.of(draft, "the draft model's tree")  # (where the failure is recorded, for later drafters)
    monkeypatch.setattr(shared, "failed", None)  # (set by the failure; None again after the test)
    draft.graphs.pool.clear()
    grown["graphed"] = 0
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = _run(target, draft, PROMPTS[1], True, **TREE)
        again = _run(target, draft, PROMPTS[2], True, **TREE)  # (a later generation tries no capture again)
    for run, wanted in ((got, want[1]), (again, want[2])):  # (the levels with the host's early stop: fewer drafts)
        assert run[:2] == wanted[:2] and run[3:] == wanted[3:]
    ours = [w for w in seen if issubclass(w.category, FastDecodeWarning)]
    assert len(ours) == 1 and "operation not permitted when stream is capturing)" in str(ours[0].message)
    assert grown["graphed"] == 0 and shared.failed is not None
    draft.graphs.pool.clear()
    target.graphs.pool.clear()


def test_graph_true_needs_a_graphed_draft_and_no_early_stop(causal, models):
    target, _, _ = models
    with pytest.raises(ParameterError, match="graphs"):
        fastdecode.generate(target, "x", "spec.dyntree", draft=causal, graph=True, max_new_tokens=4)
    with pytest.raises(ParameterError, match="early_stop"):
        fastdecode.generate(target, "x", "spec.dyntree", draft=causal, graph=True, early_stop=True, max_new_tokens=4)


def test_the_graph_outputs_are_cloned(models, device):
    """The kept tree handed to the verification (left on the device there) is not the graph's static output, which
    the next replay overwrites; the draft forwards are counted as the levels' forwards."""
    _, _, folder = models
    with simulated() if device.type == "cpu" else _nothing():
        draft = fastdecode.load(folder, device="cpu:0" if device.type == "cpu" else device, exact=8,
                                graphs="replay" if device.type == "cpu" else "cuda")
        tree = DraftModelTree(draft)
        drafts, kept = [], []
        for i in range(3):  # the first start's forward allocates the storage; the first tree is captured
            root = tree.start(torch.tensor([5, 6, 7, 8, 9] + [10] * i))
            drafts.append(tree.best_first(root, 3, 16, 4))
            kept.append(drafts[-1].tokens.clone())
        assert tree.graphs.stats == {"captures": 1, "replays": 2}
        assert all(isinstance(d.parents, DeviceTree) for d in drafts)
        assert tree.forwards == 3 + 3 * 3
        entry = next(g for g in tree.cache.graphs.values() if isinstance(g, model_tree.TreeGraph))
        assert entry.outputs is not None
        assert all(torch.equal(d.tokens, k) for d, k in zip(drafts, kept, strict=True))
        assert not {d.tokens.data_ptr() for d in drafts} & {o.data_ptr() for o in entry.outputs}
        assert not torch.equal(kept[0], kept[2])  # (the contexts differ, and so do their trees)


@contextlib.contextmanager
def _nothing():
    yield
