"""constraint= on the API: bad schemas, regexes and grammars fail before generation with the fix in the message;
methods that cannot apply a constraint say so; every dlm.* method (and ar.sample) keeps its output valid."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from constraint_cases import CONSTRAINTS

import fastdecode
from fastdecode import constraints
from fastdecode.constraints import ConstraintError
from fastdecode.constraints.diffusion import CanvasGuard
from fastdecode.diffusion.policy import Step, View
from fastdecode.errors import IncompatibleMethodError
from fastdecode.registry import list_methods


class NoForward:
    """Fails the test if the model is ever run."""

    def __init__(self, model) -> None:
        self.model = model

    def __enter__(self):
        self.saved = self.model.forward
        self.model.forward = lambda *a, **k: pytest.fail("the model ran before the constraint was checked")

    def __exit__(self, *exc):
        self.model.forward = self.saved


@pytest.mark.parametrize("bad, words", [
    (constraints.regex("[a-"), "regular expression is not valid"),
    (constraints.grammar("start: foo"), "unknown name"),
    (constraints.json_schema({"type": "foo"}), "Invalid type"),
    ({"regex": "(unclosed"}, "regular expression"),
])
def test_bad_constraints_fail_before_generation(causal, bad, words):
    with NoForward(causal), pytest.raises(ConstraintError, match=words) as err:
        fastdecode.generate(causal, "the quick", "spec.pld", constraint=bad)
    assert "To fix" in str(err.value)


def test_malformed_arguments_are_refused():
    with pytest.raises(ConstraintError, match="not valid JSON"):
        constraints.json_schema("{not json")
    with pytest.raises(ConstraintError, match="takes fastdecode.constraints"):
        constraints.as_constraint(42)
    with pytest.raises(ConstraintError, match="sampling"):
        constraints.regex("a", sampling="best")
    with pytest.raises(ConstraintError, match="Cannot read"):
        constraints.from_file("grammar", "/no/such/file.lark")


def test_methods_that_cannot_apply_a_constraint_say_so(causal, diffusion, monkeypatch):
    # the refusal comes before the missing-package check: nobody installs llama-cpp-python to be refused afterwards
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    with pytest.raises(IncompatibleMethodError, match="llama.cpp's own decoding loop"):
        fastdecode.generate(causal, "the quick", "llamacpp.greedy", constraint=CONSTRAINTS["regex"])
    with pytest.raises(IncompatibleMethodError, match="loop of its own"):
        fastdecode.generate(diffusion, "the quick", "dlm.freedave", constraint=CONSTRAINTS["regex"])
    with pytest.raises(IncompatibleMethodError, match="Grammar-Aligned"):
        fastdecode.generate(diffusion, "the quick", "dlm.threshold", constraint=constraints.regex("a+", sampling="gad"))


def test_ar_sample_output_is_valid(causal, check_valid):
    for c in CONSTRAINTS.values():
        compiled = c.compile(causal)
        rows = fastdecode.generate(causal, ["the quick"] * 8, "ar.sample", seed=3, max_new_tokens=40,
                                   constraint=compiled)
        assert all(check_valid(causal, compiled, r.token_ids) for r in rows)
        assert len({tuple(r.token_ids) for r in rows}) > 1  # sampling still varies within the grammar


DLM = [m.name for m in list_methods("diffusion") if m.name != "dlm.freedave"]


@pytest.mark.parametrize("rule", ["prefix", "lave"])
@pytest.mark.parametrize("name", DLM)
def test_every_dlm_method_keeps_the_canvas_valid(diffusion, check_valid, name, rule):
    c = constraints.regex(r"[a-z]{1,4}( [a-z]{1,4}){0,2}\.", diffusion=rule)
    compiled = c.compile(diffusion)
    rows = fastdecode.generate(diffusion, ["the quick brown fox", "Sort this"], name, max_new_tokens=32,
                               constraint=compiled)
    for r in rows:
        assert check_valid(diffusion, compiled, r.token_ids), (r.text, r.token_ids)
        assert r.stats.finish_reason == "eos"  # the regex ends within 32 tokens and the frontier rule forces EOS


def _step(diffusion, proposals: dict[int, int], fill: list[int], W: int):
    """A one-row dlm step over an all-masked canvas of W positions: x0 = `fill`, the policy proposes `proposals`."""
    V = diffusion.vocab_size
    logits = torch.full((1, W, V), -5.0)
    logits[0, torch.arange(W), torch.tensor(fill)] = 5.0
    view = View(torch.tensor([0]), torch.tensor([W]), torch.tensor([0]))
    masked = torch.ones(1, W, dtype=torch.bool)
    conf = torch.full((1, W), 0.5, dtype=torch.float64)
    step = Step(0, torch.tensor([0]), view, torch.full((1, W), diffusion.mask_token_id), masked, masked, logits,
                torch.tensor([fill]), conf)
    commit = torch.zeros(1, W, dtype=torch.bool)
    tokens = torch.tensor([fill])
    for j, t in proposals.items():
        commit[0, j], tokens[0, j] = True, t
    return step, commit, tokens


@pytest.mark.parametrize("rule", ["prefix", "lave"])
def test_lave_commits_ahead_of_the_frontier_and_prefix_does_not(diffusion, rule):
    """Canvas of 4 masks, regex 'abc': the policy proposes 'c' at position 2 only. LAVE fills positions 0-1 from
    the step's x0 ('a', 'b'), finds 'abc' valid and commits position 2; a proposal 'a' there fails every lookahead.
    The prefix rule commits the frontier instead."""
    a, b, c = (diffusion.tokenizer.convert_tokens_to_ids(x) for x in "abc")
    compiled = constraints.regex("abc", diffusion=rule).compile(diffusion)
    guard = CanvasGuard(compiled, [[5, 6]], diffusion.eos_token_ids, diffusion.mask_token_id)
    gen = torch.full((1, 4), diffusion.mask_token_id)
    step, commit, tokens = _step(diffusion, {2: c}, [a, b, c, 1], 4)
    kept, toks = guard.filter(step, commit, tokens, gen, None)
    if rule == "lave":
        assert kept[0].tolist() == [False, False, True, False] and int(toks[0, 2]) == c
        assert guard.witness[0][:3] == [a, b, c]
        step, commit, tokens = _step(diffusion, {2: a}, [a, b, c, 1], 4)
        kept, toks = guard.filter(step, commit, tokens, gen, None)  # 'a' is banned there, 'c' (next) passes
        assert kept[0].tolist() == [False, False, True, False] and int(toks[0, 2]) == c
        assert guard.tries[0] == [(2, a, False), (2, c, True)]
    else:
        assert kept[0].tolist() == [True, False, False, False] and int(toks[0, 0]) == a


SPARSE = [m.name for m in list_methods("causal") if m.name.startswith("sparse.")]


@pytest.mark.parametrize("name", SPARSE)
def test_every_sparse_method_keeps_the_output_valid(causal, check_valid, name):
    """sparse.* decode through the ar driver; the grammar mask must reach it like ar.greedy's (regression: it did
    not, and the output was unconstrained without a word)."""
    compiled = CONSTRAINTS["regex"].compile(causal)
    prompt = "the quick brown fox " * 4  # longer than the budget, so the rule selects
    extra = {"window": 4} if name == "sparse.snapkv" else {}  # its observation window must fit the budget
    r = fastdecode.generate(causal, prompt, name, budget=16, sinks=2, recent=4, max_new_tokens=24,
                            constraint=compiled, **extra)
    assert check_valid(causal, compiled, r.token_ids), (r.text, r.token_ids)
