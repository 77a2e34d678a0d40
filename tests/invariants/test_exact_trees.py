"""Exact mode and tree drafts (docs/gpu.md, "Trees on a GPU"): a greedy tree path that is not the tree's first
branch is cut after its first node off that branch, or confirmed as a chain by one more target forward (counted in
the step's forwards) where the cut would keep less than half of what the confirmation keeps; the output stays
ar.greedy's token for token; sampling and non-exact runs never cut or confirm."""

from __future__ import annotations

import pytest
import torch

import fastdecode
from fastdecode import attention
from fastdecode.engine import encode_batch
from fastdecode.registry import RunContext
from fastdecode.speculative.drafter import BaseDrafter, Draft, SpecConfig
from fastdecode.speculative.driver import _Row, speculative
from fastdecode.speculative.tree import DeviceTree, branch_first, depths, first_branch_prefix, reorder

PROMPTS = ["Sort this", "the quick brown fox"]
NEW = 24


def tree_draft(tokens: list[int], parents: list[int], unread: bool) -> Draft:
    """A tree draft; `unread`: its shape as a `DeviceTree`, as a best-first tree on a GPU leaves it (here on the CPU:
    the same tensor code, the driver's device path)."""
    shape = DeviceTree(torch.tensor(parents), max(depths(parents))) if unread else parents
    return Draft(torch.tensor(tokens, dtype=torch.long), parents=shape)


class Branches(BaseDrafter):
    """Drafts the true continuation as a tree: a wrong first child of the root, then (when `second`) the truth as a
    chain under the root's second child, so the accepted path skips node 0's column; else the truth as the first
    branch and the wrong token as the root's second child."""

    tree_drafts = True

    def __init__(self, truth: list[int], prompt_len: int, vocab: int, second: bool, unread: bool = False) -> None:
        self.truth, self.prompt_len, self.vocab, self.second, self.unread = truth, prompt_len, vocab, second, unread

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        made = context.numel() - self.prompt_len
        right = list(self.truth[made : made + min(k, 3)])
        if not right:
            return Draft.empty()
        wrong = (right[0] + 1) % self.vocab
        if self.second:
            tokens, parents = [wrong] + right, [-1, -1] + list(range(1, len(right)))
        else:
            tokens, parents = right + [wrong], list(range(-1, len(right) - 1)) + [-1]
        return tree_draft(tokens, parents, self.unread)


@pytest.fixture(scope="module")
def bf16(causal_dir, load_model):
    return load_model(causal_dir, dtype="bfloat16", exact=8)


def run(model, second: list[bool], cfg: SpecConfig | None = None, unread: bool = False):
    """The rows' tokens and the step events of a run whose row b drafts with `Branches(second=second[b])`."""
    cfg = cfg or SpecConfig(max_new_tokens=NEW)
    truth = [r.token_ids for r in fastdecode.generate(model, PROMPTS, "ar.greedy", max_new_tokens=NEW)]
    batch = encode_batch(model, PROMPTS, NEW)
    made = iter(Branches(t, n, model.vocab_size, s, unread)
                for t, n, s in zip(truth, batch.lengths, second, strict=True))
    events = list(speculative(model, batch, cfg, RunContext(), lambda g: next(made)))
    tokens = [[t for e in events for _, t in e.tokens[b]] for b in range(len(PROMPTS))]
    return truth, tokens, events


def run_one(model, text: str, make):
    """ar.greedy's tokens for one prompt, the drafter `make(truth, prompt_len, vocab)` and the step events of a run
    that drafts with it."""
    prompt = model.encode(text)
    truth = fastdecode.generate(model, prompt, "ar.greedy", max_new_tokens=NEW).token_ids
    drafter = make(truth, len(prompt), model.vocab_size)
    cfg = SpecConfig(max_new_tokens=NEW)
    events = list(speculative(model, encode_batch(model, [prompt], NEW), cfg, RunContext(), lambda g: drafter))
    return truth, drafter, events


@pytest.mark.parametrize("unread", [False, True])
def test_a_path_off_the_first_branch_is_confirmed_by_one_more_forward(bf16, unread):
    truth, tokens, events = run(bf16, [True, True], unread=unread)
    assert tokens == truth
    # every step's path went through node 1, off the first branch from its first node: a path of 2 or 3 nodes is
    # confirmed (cut at its first node it would keep 1 token a forward, confirmed (a + 1) / 2)
    long = [e for e in events if any(p >= 3 for p in e.proposed)]
    assert long and all(e.forwards == 2 for e in long)
    assert all(e.forwards == 1 for e in events if not any(e.proposed))
    # the chain verdict accepts the whole path: the truth, up to 3 tokens and the bonus per step
    assert all(a == p - 1 for e in long for a, p in zip(e.accepted, e.proposed, strict=True) if p >= 3)


class Departs(BaseDrafter):
    """Drafts the truth's next 4 tokens as the tree's first branch for 2 nodes, then a wrong child of node 1 (node 2)
    and the truth's third and fourth tokens under node 1 after it (nodes 3, 4): the accepted path leaves the first
    branch at its third node."""

    tree_drafts = True

    def __init__(self, truth: list[int], prompt_len: int, vocab: int) -> None:
        self.truth, self.prompt_len, self.vocab = truth, prompt_len, vocab

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        made = context.numel() - self.prompt_len
        right = list(self.truth[made : made + min(k, 4)])
        if len(right) < 4:
            return Draft(torch.tensor(right, dtype=torch.long))
        wrong = (right[2] + 1) % self.vocab
        tokens = [right[0], right[1], wrong, right[2], right[3]]
        return Draft(torch.tensor(tokens, dtype=torch.long), parents=[-1, 0, 1, 1, 3])


def test_a_path_that_leaves_the_first_branch_late_is_cut_where_it_leaves_without_a_forward(bf16):
    """Its nodes on the first branch and the first one off it were decided by rows a chain computes alike: those 3
    tokens in one forward beat the path's 4 and the bonus in two (docs/gpu.md, "Trees on a GPU")."""
    truth, _, events = run_one(bf16, PROMPTS[1], Departs)
    assert [t for e in events for _, t in e.tokens[0]] == truth
    assert all(e.forwards == 1 for e in events)
    trees = [e for e in events if e.proposed[0] == 5]
    assert trees and all(e.accepted[0] == 2 and len(e.tokens[0]) == 3 for e in trees)


def test_the_first_branch_needs_no_confirmation(bf16):
    truth, tokens, events = run(bf16, [False, False])
    assert tokens == truth and all(e.forwards == 1 for e in events)


@pytest.mark.parametrize("unread", [False, True])
def test_rows_that_need_it_are_confirmed_beside_rows_that_do_not(bf16, unread):
    truth, tokens, events = run(bf16, [True, False], unread=unread)
    assert tokens == truth
    assert any(e.forwards == 2 for e in events)


def test_outside_exact_mode_and_when_sampling_nothing_is_confirmed(causal, bf16):
    truth, tokens, events = run(causal, [True, True])  # float32, exact mode off
    assert tokens == truth and all(e.forwards == 1 for e in events)
    _, _, events = run(bf16, [True, True], SpecConfig(max_new_tokens=NEW, temperature=0.8, seed=3))
    assert all(e.forwards == 1 for e in events)


class BreadthFirst(BaseDrafter):
    """Drafts the truth as the first-listed path of a tree listed breadth first (as spec.recycling's template is):
    root children [truth 0, wrong], then the truth's next token under node 0, and records the logits it is told."""

    tree_drafts = True

    def __init__(self, truth: list[int], prompt_len: int, vocab: int, unread: bool = False) -> None:
        self.truth, self.prompt_len, self.vocab, self.unread = truth, prompt_len, vocab, unread
        # (tokens made at the proposal, node logits told, accepted nodes told)
        self.told: list[tuple[int, torch.Tensor, tuple[int, ...] | None]] = []

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        self.made = context.numel() - self.prompt_len
        right = list(self.truth[self.made : self.made + min(k, 2)])
        if len(right) < 2:
            return Draft(torch.tensor(right, dtype=torch.long))
        wrong = (right[0] + 1) % self.vocab
        return tree_draft([right[0], wrong, right[1]], [-1, -1, 0], self.unread)

    def observe(self, verification) -> None:
        if verification.num_draft == 3:
            self.told.append((self.made, verification.node_logits, verification.nodes))


@pytest.mark.parametrize("unread", [False, True])
def test_a_breadth_first_tree_is_verified_first_branch_first_and_observed_as_drafted(bf16, unread):
    truth, drafter, events = run_one(bf16, PROMPTS[0], lambda *a: BreadthFirst(*a, unread=unread))
    assert [t for e in events for _, t in e.tokens[0]] == truth
    assert all(e.forwards == 1 for e in events)  # the path (nodes 0, 2) became the first branch: no confirmation
    assert drafter.told
    for made, logits, nodes in drafter.told:  # the drafter's order: root, node 0 (truth), node 1, node 2 (truth)
        assert int(logits[1].argmax()) == truth[made + 1] and int(logits[3].argmax()) == truth[made + 2]
        assert nodes in ((), (0,), (0, 2))  # the accepted nodes too (verified as 0, 1 after the reorder)
    assert any(nodes == (0, 2) for _, _, nodes in drafter.told)


def test_branch_first_lists_the_first_branch_then_the_rest_as_listed():
    parents = [-1, -1, 0, 0, 1, 2]  # breadth first: the first branch is nodes 0, 2, 5
    order = branch_first(parents)
    assert order == [0, 2, 5, 1, 3, 4]
    assert reorder(parents, order) == [-1, 0, 1, -1, 0, 3]
    assert first_branch_prefix(reorder(parents, order), (0, 1, 2)) == 3
    assert branch_first([-1, 0, 1]) == [0, 1, 2] and branch_first([]) == []


def test_first_branch_is_nodes_zero_to_a_minus_one_in_a_row():
    parents = [-1, 0, -1, 2]

    def on_first_branch(parents: list[int], path: tuple[int, ...]) -> bool:  # the whole path on it
        return first_branch_prefix(parents, path) == len(path)

    assert on_first_branch(parents, ()) and on_first_branch(parents, (0, 1))
    assert not on_first_branch(parents, (2, 3)) and not on_first_branch(parents, (2,))
    assert not on_first_branch([-1, -1, 1], (1, 2))  # node 1 is the root's child, not node 0's
    assert first_branch_prefix(parents, (0, 1)) == 2 and first_branch_prefix(parents, (2, 3)) == 0
    assert first_branch_prefix([-1, 0, 1, 1], (0, 1, 3)) == 2  # leaves it at node 3, node 1's 2nd child
    # a sibling holding the first branch's token is still off it: its row was computed with node 0 between
    assert first_branch_prefix([-1, -1, 0], (1,)) == 0


@pytest.fixture
def gap_sensitive(monkeypatch):
    """Attention that, like a GPU kernel summing in tiles, depends on where a row's visible keys sit: a row whose
    visible columns have a gap (a tree node with siblings between its ancestors) gets a fixed offset, large enough
    to move its argmax. Rows whose keys sit side by side (ar.greedy, chains, a tree's first branch) are untouched."""
    exact = attention.grouped

    def grouped(q, k, v, mask, scale):  # [B, Hq, Q, D], [B, Hkv, K, D], [B, Hkv, K, Dv], [B, 1, Q, K]
        out = exact(q, k, v, mask, scale)  # [B, Hq, Q, Dv]
        seen = mask[:, 0]  # [B, Q, K]
        cols = torch.arange(seen.shape[-1], device=seen.device)
        span = torch.where(seen, cols, -1).amax(-1) - torch.where(seen, cols, seen.shape[-1]).amin(-1) + 1  # [B, Q]
        gap = (span > seen.sum(-1)) & seen.any(-1)  # [B, Q]
        offset = torch.linspace(-2.0, 2.0, out.shape[-1], device=out.device, dtype=out.dtype)  # [Dv]
        return out + gap[:, None, :, None] * offset

    monkeypatch.setattr(attention, "grouped", grouped)
    attention.use_grouped_attention(True)
    yield
    attention.use_grouped_attention(False)


@pytest.mark.parametrize("method", ["branches", "spec.recycling", "spec.rsd"])
def test_trees_equal_ar_greedy_under_an_attention_that_depends_on_gaps(bf16, gap_sensitive, monkeypatch, method):
    def tokens():
        if method == "branches":
            return run(bf16, [True, True])[1]
        kw = {"draft": bf16} if method == "spec.rsd" else {}
        return [r.token_ids for r in fastdecode.generate(bf16, PROMPTS, method, max_new_tokens=NEW, **kw)]

    truth = [r.token_ids for r in fastdecode.generate(bf16, PROMPTS, "ar.greedy", max_new_tokens=NEW)]
    assert tokens() == truth
    # the control: without the confirmation (or the cut) the same run leaves ar.greedy (the offset bites)
    monkeypatch.setattr(_Row, "exact_verdict", lambda self, draft, verdict: verdict)
    assert tokens() != truth
