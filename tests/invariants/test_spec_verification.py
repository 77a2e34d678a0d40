"""What the driver tells a drafter after each verification (`Drafter.observe(Verification)`): counts, emitted
tokens, the target's logits by part, and the target's hidden states for drafters that ask for them."""

from __future__ import annotations

import pytest
import torch

import fastdecode
from fastdecode.engine import encode_batch
from fastdecode.registry import RunContext
from fastdecode.speculative.drafter import BaseDrafter, Draft, SpecConfig, Verification
from fastdecode.speculative.drafters.lookahead import LookaheadConfig, LookaheadDrafter
from fastdecode.speculative.driver import speculative

LONG = "Sort this"  # runs 40 tokens without EOS on the tiny model


@pytest.fixture(scope="module")
def truth(causal):
    prompt = causal.encode(LONG)
    return prompt, fastdecode.generate(causal, prompt, "ar.greedy", max_new_tokens=24).token_ids


class HalfRight(BaseDrafter):
    """Drafts the true continuation with its third token wrong, and records what it is told."""

    def __init__(self, truth: list[int], prompt_len: int, vocab: int, needs_hidden: bool) -> None:
        self.truth, self.prompt_len, self.vocab, self.needs_hidden = truth, prompt_len, vocab, needs_hidden
        self.seen: list[tuple[int, Verification]] = []  # (context length at the proposal, what observe got)
        self._n = 0

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        self._n = context.numel()
        made = self._n - self.prompt_len
        tokens = list(self.truth[made : made + min(k, 4)])
        if len(tokens) > 2:
            tokens[2] = (tokens[2] + 1) % self.vocab
        return Draft(torch.tensor(tokens, dtype=torch.long))

    def observe(self, verification: Verification) -> None:
        self.seen.append((self._n, verification))


def run(causal, drafter, prompt, cfg=None):
    cfg = cfg or SpecConfig(max_new_tokens=24)
    batch = encode_batch(causal, [prompt], cfg.max_new_tokens)
    return list(speculative(causal, batch, cfg, RunContext(), lambda g: drafter))


def test_observe_gets_counts_tokens_and_logits_by_part(causal, truth):
    prompt, out = truth
    drafter = HalfRight(out, len(prompt), causal.vocab_size, needs_hidden=False)
    events = run(causal, drafter, prompt)
    assert [t for e in events for _, t in e.tokens[0]] == out
    assert len(drafter.seen) == len(events) - 1  # the last step finishes the row instead
    for (_, v), event in zip(drafter.seen, events[:-1], strict=True):
        k = v.num_draft
        assert v.hidden is None and v.node_hidden is None and v.context_hidden is None  # not asked for
        assert v.accepted == event.accepted[0] == min(k, 2) and v.tokens == tuple(t for _, t in event.tokens[0])
        assert v.logits.shape == (1 + k, causal.vocab_size) and v.side_logits is None
        assert torch.equal(v.root_logits, v.logits[0]) and torch.equal(v.draft_logits, v.logits[1:])
        assert v.node_logits.shape[0] == 1 + k
        # greedy: the target's own token is the argmax after the last accepted node
        assert int(v.node_logits[v.accepted].argmax()) == v.tokens[-1]


def test_a_drafter_that_needs_hidden_states_gets_those_of_every_fed_token(causal, truth):
    prompt, out = truth
    drafter = HalfRight(out, len(prompt), causal.vocab_size, needs_hidden=True)
    events = run(causal, drafter, prompt)
    assert [t for e in events for _, t in e.tokens[0]] == out  # asking for features changes no token
    with torch.inference_mode():
        ids = torch.tensor([prompt + out], device=causal.device)
        ref = causal.model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0]
    fed = len(prompt)  # context tokens the target has seen after the step
    for step, (n, v) in enumerate(drafter.seen):
        P = n - fed if step else n  # the first forward feeds the whole prompt
        assert v.hidden.shape == (P + v.num_draft, causal.config.hidden_size)
        assert torch.allclose(v.context_hidden, ref[n - P : n], atol=1e-4)
        assert torch.equal(v.node_hidden[0], v.context_hidden[-1])  # the root is the last context token
        # the root and the accepted (true) draft nodes sit where the plain forward over the output has them
        assert torch.allclose(v.node_hidden[: 1 + v.accepted], ref[n - 1 : n + v.accepted], atol=1e-4)
        fed = n + v.accepted  # a chain keeps its accepted prefix in the cache


def test_a_drafter_that_asks_for_layers_gets_them_for_every_fed_token(causal, truth):
    """`hidden_layers` (EAGLE-3 reads three layers): each layer asked, in the drafter's order, at every fed token,
    where a plain transformers forward over the output has it (`hidden_states[i + 1]`)."""
    prompt, out = truth
    drafter = HalfRight(out, len(prompt), causal.vocab_size, needs_hidden=True)
    drafter.hidden_layers = (-1, 0)  # any order; negative counts from the end
    events = run(causal, drafter, prompt)
    assert [t for e in events for _, t in e.tokens[0]] == out  # asking for layers changes no token
    with torch.inference_mode():
        ids = torch.tensor([prompt + out], device=causal.device)
        states = causal.model(input_ids=ids, output_hidden_states=True).hidden_states
    fed = len(prompt)
    for step, (n, v) in enumerate(drafter.seen):
        P = n - fed if step else n
        top, first = v.layers
        assert top.shape == first.shape == v.hidden.shape
        # layer 0 where transformers has it; the last layer is the hidden state before the final norm
        assert torch.allclose(first[:P], states[1][0, n - P : n], atol=1e-4)
        assert torch.allclose(first[P - 1 : P + v.accepted], states[1][0, n - 1 : n + v.accepted], atol=1e-4)
        with torch.inference_mode():
            assert torch.allclose(causal.model.model.norm(top), v.hidden, atol=1e-5)
        fed = n + v.accepted
    assert not HalfRight(out, len(prompt), causal.vocab_size, needs_hidden=True).hidden_layers  # declared default


def test_side_tokens_logits_come_separately(causal, truth):
    prompt, _ = truth
    cfg = LookaheadConfig(ngram=3, window=4, guesses=2, max_new_tokens=16)
    seen = []

    class Recording(LookaheadDrafter):
        def propose(self, context, k):
            self.draft = super().propose(context, k)
            return self.draft

        def observe(self, verification):
            seen.append((self.draft, verification))
            super().observe(verification)

    run(causal, Recording(cfg), prompt, cfg)
    assert seen
    for draft, v in seen:
        S = draft.side.tokens.numel()
        assert v.num_draft == draft.tokens.numel() and v.side_logits.shape == (S, causal.vocab_size)
        assert torch.equal(v.side_logits, v.logits[1 + v.num_draft :])
