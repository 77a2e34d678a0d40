"""LAVE as its authors run it (`constraints/diffusion.py`): a rejected proposal is banned at its position and the
next likeliest token there is tried, `retries` tries in all; then the step recovers from the cached witness. The
beam lookahead (`lave_search="beam"`) accepts what the sampled one accepts on a canvas with one completion."""

from __future__ import annotations

import pytest
import torch

from fastdecode import constraints
from fastdecode.constraints.diffusion import CanvasGuard
from fastdecode.diffusion.policy import Step, View


def _ids(diffusion, text: str) -> list[int]:
    return [diffusion.tokenizer.convert_tokens_to_ids(x) for x in text]


def _step(diffusion, ranked: dict[int, list[int]], W: int, proposals: dict[int, int]):
    """One row, an all-masked canvas of W positions; at view column j the tokens `ranked[j]` get logits 10, 9, 8, ...
    (the first is x0), every other token -20; the policy proposes `proposals`."""
    V = diffusion.vocab_size
    logits = torch.full((1, W, V), -20.0)
    x0 = torch.zeros(1, W, dtype=torch.long)
    for j, toks in ranked.items():
        logits[0, j, torch.tensor(toks)] = 10.0 - torch.arange(len(toks), dtype=torch.float)
        x0[0, j] = toks[0]
    logits[..., diffusion.mask_token_id] = float("-inf")
    view = View(torch.tensor([0]), torch.tensor([W]), torch.tensor([0]))
    masked = torch.ones(1, W, dtype=torch.bool)
    conf = torch.full((1, W), 0.5, dtype=torch.float64)
    step = Step(0, torch.tensor([0]), view, torch.full((1, W), diffusion.mask_token_id), masked, masked, logits, x0,
                conf)
    commit = torch.zeros(1, W, dtype=torch.bool)
    tokens = x0.clone()
    for j, t in proposals.items():
        commit[0, j], tokens[0, j] = True, t
    return step, commit, tokens


def _guard(diffusion, **options):
    compiled = constraints.regex("abc", diffusion="lave", **options).compile(diffusion)
    return CanvasGuard(compiled, [[5, 6]], diffusion.eos_token_ids, diffusion.mask_token_id)


def test_a_rejected_proposal_is_banned_and_the_next_token_tried(diffusion):
    """Regex 'abc' on 4 masks: at position 2 the model ranks 'a', 'b', 'c'. 'a' and 'b' fail the lookahead and are
    banned (never proposed again in the step); 'c' passes and is committed."""
    a, b, c = _ids(diffusion, "abc")
    guard = _guard(diffusion)
    step, commit, tokens = _step(diffusion, {0: [a], 1: [b], 2: [a, b, c], 3: [1]}, 4, {2: a})
    kept, toks = guard.filter(step, commit, tokens, torch.full((1, 4), diffusion.mask_token_id), None)
    assert guard.tries[0] == [(2, a, False), (2, b, False), (2, c, True)]
    rejected = [(p, t) for p, t, ok in guard.tries[0] if not ok]
    assert len(set(rejected)) == len(rejected)  # no rejected proposal is tried twice
    assert kept[0].tolist() == [False, False, True, False] and int(toks[0, 2]) == c
    assert guard.witness[0][:3] == [a, b, c]


@pytest.mark.parametrize("retries", [1, 3, 5])
def test_a_proposal_gets_at_most_retries_tries_then_the_step_recovers(diffusion, retries):
    """At position 2 the model ranks six tokens before 'c': every try fails, so the proposal gets exactly `retries`
    tries, each a new token, and the step then recovers: with no witness yet, the frontier's own x0."""
    a, b, c = _ids(diffusion, "abc")
    wrong = _ids(diffusion, "defghi")
    guard = _guard(diffusion, retries=retries)
    step, commit, tokens = _step(diffusion, {0: [a], 1: [b], 2: [*wrong, c], 3: [1]}, 4, {2: wrong[0]})
    kept, toks = guard.filter(step, commit, tokens, torch.full((1, 4), diffusion.mask_token_id), None)
    assert [(p, t) for p, t, _ in guard.tries[0]] == [(2, t) for t in wrong[:retries]]
    assert not any(ok for _, _, ok in guard.tries[0])
    assert kept[0].tolist() == [True, False, False, False] and int(toks[0, 0]) == a


def test_recovery_fills_the_masks_from_the_cached_witness(diffusion):
    """A first step commits 'c' at position 2 (witness 'abc'); a second step's only proposal, at position 3, fails
    every try: the step then commits the witness's tokens at positions 0 and 1."""
    a, b, c = _ids(diffusion, "abc")
    wrong = _ids(diffusion, "def")
    guard = _guard(diffusion, retries=3)
    gen = torch.full((1, 4), diffusion.mask_token_id)
    step, commit, tokens = _step(diffusion, {0: [a], 1: [b], 2: [c], 3: [1]}, 4, {2: c})
    kept, _ = guard.filter(step, commit, tokens, gen, None)
    assert kept[0].tolist() == [False, False, True, False]
    gen[0, 2] = c
    step, commit, tokens = _step(diffusion, {0: [wrong[0]], 1: [wrong[1]], 2: [c], 3: wrong}, 4, {3: wrong[0]})
    kept, toks = guard.filter(step, commit, tokens, gen, None)
    assert len(guard.tries[0]) == 3 and not any(ok for _, _, ok in guard.tries[0])
    assert kept[0].tolist() == [True, True, False, False] and toks[0, :2].tolist() == [a, b]


@pytest.mark.parametrize("search", ["sample", "beam"])
def test_both_lookaheads_accept_the_completable_proposal_and_refuse_the_other(diffusion, search):
    """'c' at position 2 completes to 'abc' (passes); 'b' there fails every filling and, with one try, is not
    committed. The beam (10 wide) finds 'ab' at positions 0-1 where the model ranks 'b' first at 0 and 'a' at 1,
    which the sampled lookahead's first filling (the argmax) would miss."""
    a, b, c = _ids(diffusion, "abc")
    first = {0: [b, a], 1: [a, b]} if search == "beam" else {0: [a, b], 1: [b, a]}
    options = {"lave_search": search, "retries": 1, "beam_width": 10}  # fillings with 1 = a outscore "ab"
    gen = torch.full((1, 4), diffusion.mask_token_id)
    guard = _guard(diffusion, **options)
    step, commit, tokens = _step(diffusion, {**first, 2: [c], 3: [1]}, 4, {2: c})
    kept, _ = guard.filter(step, commit, tokens, gen, None)
    assert kept[0].tolist() == [False, False, True, False] and guard.witness[0][:3] == [a, b, c]
    guard = _guard(diffusion, **options)
    step, commit, tokens = _step(diffusion, {**first, 2: [b], 3: [1]}, 4, {2: b})
    kept, _ = guard.filter(step, commit, tokens, gen, None)
    assert guard.tries[0] == [(2, b, False)] and not kept[0, 2]


def test_bad_lave_settings_are_refused():
    for bad in ({"retries": 0}, {"lave_search": "greedy"}, {"beam_top_k": 0}, {"beam_random": -1}):
        with pytest.raises(constraints.ConstraintError):
            constraints.regex("abc", **bad)
