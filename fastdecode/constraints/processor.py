"""The grammar mask as a stateful processor of the logits pipeline (sampling/pipeline.py `StatefulProcessor`).

A state is an immutable value `(prompt key, output tokens)`: the History keeps each sequence's committed state,
verification positions derive theirs along the drafted path (a chain or a tree), and nothing needs rolling back
when a draft is rejected. Behind the states sits one backend matcher per prompt, used as a cursor: to read the
mask at a state it rolls back to the longest common prefix with what it consumed and consumes the rest (so the
matcher's state rolls back with the KV cache: by the rejected draft tokens). Masks are memoised per state.

With `sampling="gad"` the processor also reweights every allowed token x by the estimated expected future
grammaticality of prefix + x (ASAp, Park et al. 2024, arXiv 2405.21047): a trie over the prefixes seen so far
stores, per node, the model's distribution p and the estimate EFG(node) = sum_x p(x) EFG(node + x) (1 for prefixes
never expanded, 0 for tokens the grammar forbids). Each visit makes the estimates exact along the visited path;
as calls repeat, the samples' law converges to p(output | output in the grammar).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..sampling.history import Positions
from .backend import Matcher

if TYPE_CHECKING:  # a type only: constraint.py makes this processor (`Compiled.processor()`), not the other way
    from .constraint import Compiled

State = tuple[int, tuple[int, ...]]  # (prompt key, output tokens)
_MEMO = 256  # masks kept per request


class GrammarMask:
    """-inf on every token the grammar forbids at each position (and GAD's reweighting when asked)."""

    uses_history = True
    stateful = True

    def __init__(self, compiled: Compiled) -> None:
        self.compiled = compiled
        self.vocab_size = compiled.grammar.vocab_size
        # prompt -> key; GAD's trie outlives the request, so its keys are kept with it
        self._prompts: dict[tuple[int, ...], int] = (
            compiled.gad_trie.setdefault("prompts", {}) if compiled.gad_trie is not None else {}
        )
        self._cursors: dict[int, tuple[Matcher, list[int]]] = {}
        self._memo: OrderedDict[State, torch.Tensor | None] = OrderedDict()
        self.gad: dict[State, Any] | None = (
            compiled.gad_trie.setdefault("nodes", {}) if compiled.gad_trie is not None else None
        )
        self.eos = frozenset(compiled.eos)

    # --- StatefulProcessor
    def start(self) -> State:
        return self.begin(())

    def begin(self, prompt: Sequence[int]) -> State:
        """The state at the start of the output of `prompt` (the grammar constrains only the output)."""
        key = self._prompts.setdefault(tuple(prompt), len(self._prompts))
        return (key, ())

    def advance(self, state: State, token: int) -> State:
        return (state[0], state[1] + (int(token),))

    def advance_all(self, state: State, tokens: Sequence[int]) -> State:
        return (state[0], state[1] + tuple(int(t) for t in tokens))

    # --- masks
    def _sync(self, state: State) -> tuple[Matcher, bool]:
        """The prompt's matcher moved to `state`; False when `state` leaves the grammar (a forbidden drafted token)."""
        key, tokens = state
        if key not in self._cursors:
            self._cursors[key] = (self.compiled.grammar.start(), [])
        matcher, done = self._cursors[key]
        if len(done) <= len(tokens) and tuple(done) == tokens[: len(done)]:
            common = len(done)  # the usual case: the cursor is behind on the same path (one compare in C)
        else:
            common = 0
            for a, b in zip(done, tokens, strict=False):
                if a != b:
                    break
                common += 1
        matcher.rollback(len(done) - common)
        del done[common:]
        rest = list(tokens[common:])
        took = matcher.advance(rest)
        done.extend(rest[:took])
        return matcher, took == len(rest)

    def mask(self, state: State) -> torch.Tensor | None:
        """`[V]` bool allowed tokens at `state`; None off the grammar (a position after a forbidden draft token,
        whose logits no verdict reads)."""
        if state in self._memo:
            self._memo.move_to_end(state)
            return self._memo[state]
        t0 = time.perf_counter()
        matcher, ok = self._sync(state)
        allowed = matcher.allowed() if ok else None
        self.compiled.mask_s += time.perf_counter() - t0
        self.compiled.masks += 1
        self._memo[state] = allowed
        if len(self._memo) > _MEMO:
            self._memo.popitem(last=False)
        return allowed

    def valid_prefix(self, state: State, tokens: Sequence[int]) -> int:
        """How many of `tokens`, from `state`, the grammar allows in a row (drafts are cut there)."""
        if not len(tokens):
            return 0
        t0 = time.perf_counter()
        matcher, ok = self._sync(state)
        n = matcher.valid(list(tokens)) if ok else 0
        self.compiled.mask_s += time.perf_counter() - t0
        return n

    def accepting(self, state: State) -> bool:
        matcher, ok = self._sync(state)
        return ok and matcher.accepting

    def __call__(self, logits: torch.Tensor, at: Positions | None) -> torch.Tensor:
        assert at is not None, "the grammar mask needs each position's history"
        states = at.states(self)
        rows, live = [], []
        for s in states:
            m = self.mask(s)
            # off the grammar (after a forbidden draft token) or past the end (a finished row of a batch, fed
            # padding): nothing this position emits is kept, so it is left unmasked rather than all -inf. A matcher
            # that failed never gets here: it raises MatcherError (backend.py), so no request decodes free text
            live.append(m is not None and bool(m.any()))
            rows.append(m if m is not None and live[-1] else torch.ones(self.vocab_size, dtype=torch.bool))
        self.compiled.calls += 1
        allowed = torch.stack(rows).to(logits.device)
        V = logits.shape[-1]
        if allowed.shape[-1] != V:  # logits wider than the vocabulary: the extra rows are never allowed
            allowed = torch.nn.functional.pad(allowed, (0, V - allowed.shape[-1]), value=False)[:, :V]
        if self.gad is not None:
            logits = logits + self._gad_log_weights(logits, states, allowed, live)
        return logits.masked_fill(~allowed, float("-inf"))

    # --- Grammar-Aligned Decoding (ASAp)
    def _gad_log_weights(self, logits: torch.Tensor, states: list[State], allowed: torch.Tensor,
                         live: list[bool]) -> torch.Tensor:
        """`[N, V]` log EFG(prefix + x) per position; records p at each position and propagates the estimates.
        An EOS child is a finished sentence (EFG 1); other children never expanded count 1 until they are."""
        assert self.gad is not None
        out = torch.zeros_like(logits, dtype=torch.float32)
        probs = logits.float().softmax(-1).cpu()
        for n, s in enumerate(states):
            if not live[n]:
                continue
            node = self.gad.get(s)
            if node is None:
                node = {"p": probs[n] * allowed[n].cpu(), "child": {}, "efg": 0.0}
                node["efg"] = float(node["p"].sum())
                self.gad[s] = node
                self._propagate(s)
            child = node["child"]
            if child:
                toks = torch.tensor(list(child), dtype=torch.long)
                w = torch.tensor([child[t] for t in child], dtype=torch.float32).clamp(min=1e-30)
                out[n, toks.to(out.device)] = w.log().to(out.device)
        return out.to(logits.dtype)

    def _propagate(self, s: State) -> None:
        """EFG(s) changed: update the ancestors' estimates up the trie."""
        assert self.gad is not None
        while s[1] and s[1][-1] not in self.eos:
            parent = (s[0], s[1][:-1])
            node = self.gad.get(parent)
            if node is None:
                return
            node["child"][s[1][-1]] = self.gad[s]["efg"]
            p = node["p"]
            lost = sum(float(p[t]) * (1.0 - e) for t, e in node["child"].items())
            node["efg"] = float(p.sum()) - lost
            s = parent
