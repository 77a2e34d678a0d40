"""Constraints on a diffusion canvas: which of a step's proposed commits keep the canvas completable.

A dlm step proposes tokens at any masked positions, not left to right, so a grammar mask alone cannot say whether
a token far ahead still fits. Two rules, chosen by `Constraint.diffusion`:

- `"prefix"` (left-to-right prefix rule): only a run of proposed positions starting at the frontier (the first
  masked position) is committed, each token checked against the grammar after the ones before it; the frontier's
  logits are masked, and the frontier is committed even when the policy did not pick it. Guarantee: the committed
  text is always a prefix the grammar can extend (llguidance's masks are exact), so the output is valid whenever it
  ends with EOS within the canvas. Parallelism is only what the policy commits in a row at the frontier.
- `"lave"` (lookahead-then-verify, arXiv 2602.00612): every proposed token, in order of confidence, is tried; the
  masks between the frontier and the last committed position are filled `lookahead` times (first from the last
  verified completion and the step's argmax, then by sampling the step's per-position distributions), and the
  token is kept when one filling makes a text the grammar can extend. The filling that passed is kept as the
  witness: committing the witness's frontier token always keeps the canvas completable, which is the fallback when
  no proposal passes. Guarantee: after every step some filling of the masks is a prefix the grammar can extend
  (the witness); positions far ahead may be committed in parallel. Neither rule can promise the grammar ends
  within the canvas's fixed length.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .beam import beam_lookahead
from .constraint import Compiled


class CanvasGuard:
    """The constraint of one dlm request: per batch row the grammar state of its committed prefix and a witness."""

    def __init__(self, compiled: Compiled, prompts: list[list[int]], eos: frozenset[int], mask_id: int) -> None:
        self.compiled = compiled
        self.rule = compiled.constraint.diffusion
        self.lookahead = compiled.constraint.lookahead
        self.proc = compiled.processor()
        self.starts = [self.proc.begin(p) for p in prompts]
        self.eos, self.mask_id = eos, mask_id
        self.witness: list[list[int] | None] = [None] * len(prompts)
        c = compiled.constraint
        self.retries, self.search = c.retries, c.lave_search
        self.beam = (c.beam_top_k, c.beam_width, c.beam_random)
        self.tries: list[list[tuple[int, int, bool]]] = [[] for _ in prompts]  # LAVE: the last step's (offset,
        #   token, passed) per row, in the order tried

    def _state(self, row: int, prefix: list[int]) -> Any:
        key, _ = self.starts[row]
        return (key, tuple(prefix))

    def mask_frontier(self, logits: torch.Tensor, rows: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
                      gen: torch.Tensor) -> torch.Tensor:
        """`[B', W, V]` view logits with the grammar mask at each row's frontier (the first masked position)."""
        logits = logits.clone()
        for i, row in enumerate(rows.tolist()):
            f = self._frontier(gen[i])
            if not int(lo[i]) <= f < int(hi[i]):
                continue
            allowed = self.proc.mask(self._state(row, gen[i, :f].tolist()))
            if allowed is not None:
                col = logits[i, f - int(lo[i])]
                keep = allowed.to(col.device)[: col.shape[-1]]
                logits[i, f - int(lo[i]), : keep.shape[0]] = col[: keep.shape[0]].masked_fill(~keep, float("-inf"))
                logits[i, f - int(lo[i]), keep.shape[0]:] = float("-inf")
        return logits

    def _frontier(self, gen_row: torch.Tensor) -> int:
        masked = (gen_row == self.mask_id).nonzero()
        return int(masked[0]) if masked.numel() else gen_row.numel()

    def filter(self, step: Any, commit: torch.Tensor, tokens: torch.Tensor, gen: torch.Tensor,
               generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The commits (`[B', W]` bool) and tokens that keep every row's canvas completable; at least one per row
        whose frontier is in view."""
        t0 = time.perf_counter()
        commit, tokens = commit.clone(), tokens.clone()
        for i, row in enumerate(step.rows.tolist()):
            lo = int(step.view.lo[i])
            if self.rule == "prefix":
                self._prefix(i, row, lo, step, commit, tokens, gen[i])
            else:
                self._lave(i, row, lo, step, commit, tokens, gen[i], generator)
        self.compiled.mask_s += time.perf_counter() - t0
        return commit, tokens

    def _prefix(self, i: int, row: int, lo: int, step: Any, commit: torch.Tensor, tokens: torch.Tensor,
                gen_row: torch.Tensor) -> None:
        f = self._frontier(gen_row)
        W = commit.shape[1]
        wanted = commit[i].clone()
        commit[i] = False
        if not lo <= f < lo + W or not bool(step.masked[i, f - lo]):
            return
        prefix = gen_row[:f].tolist()
        state = self._state(row, prefix)
        run = [int(tokens[i, f - lo])]  # the frontier: its logits were masked, so its x0 is allowed
        j = f + 1
        while j - lo < W and bool(wanted[j - lo]) and run[-1] not in self.eos:
            run.append(int(tokens[i, j - lo]))
            j += 1
        n = self.proc.valid_prefix(state, run)
        if n == 0:  # the policy's own token at the frontier is not the masked x0: take that
            tokens[i, f - lo], n = step.x0[i, f - lo], 1
        commit[i, f - lo : f - lo + n] = True

    def _lave(self, i: int, row: int, lo: int, step: Any, commit: torch.Tensor, tokens: torch.Tensor,
              gen_row: torch.Tensor, generator: torch.Generator | None) -> None:
        """LAVE as its authors run it: each proposal, most confident first, is verified; a rejected token is banned
        at its position and the next likeliest one there is tried, `retries` tries in all; a proposal that runs out
        of tries (or a step with no commit) recovers from the cached witness: its tokens fill the masks from the
        frontier to its end."""
        canvas = gen_row.tolist()
        f = self._frontier(gen_row)
        W = commit.shape[1]
        order = sorted((j for j in range(W) if bool(commit[i, j])), key=lambda j: -float(step.conf[i, j]))
        commit[i] = False
        state = self._state(row, canvas[:f])
        tries: list[tuple[int, int, bool]] = []
        exhausted = False
        for j in order:
            pos, tok = lo + j, int(tokens[i, j])
            banned: list[int] = []
            while len(banned) < self.retries:
                canvas[pos] = tok
                witness = self.witness[row]
                cached = witness is not None and pos < len(witness) and witness[pos] == tok  # the authors' cache hit
                found = witness if cached else self._verify(i, row, lo, step, canvas, f, state, generator)
                tries.append((pos, tok, found is not None))
                if found is not None:
                    self.witness[row] = found
                    commit[i, j], tokens[i, j] = True, tok
                    break
                canvas[pos] = self.mask_id
                banned.append(tok)
                nxt = self._next_token(step, i, j, banned)
                if nxt is None:
                    break
                tok = nxt
            else:
                exhausted = True
            if exhausted:
                break
        self.tries[row] = tries
        if (exhausted or not bool(commit[i].any())) and lo <= f < lo + W and bool(step.masked[i, f - lo]):
            self._recover(i, row, lo, step, commit, tokens, canvas, f)

    def _next_token(self, step: Any, i: int, j: int, banned: list[int]) -> int | None:
        """The likeliest token at view column j once `banned` are removed (None when nothing is left)."""
        scores = step.logits[i, j].clone()
        scores[torch.tensor(banned, dtype=torch.long, device=scores.device)] = float("-inf")
        best = int(scores.argmax())
        return None if scores[best] == float("-inf") else best

    def _recover(self, i: int, row: int, lo: int, step: Any, commit: torch.Tensor, tokens: torch.Tensor,
                 canvas: list[int], f: int) -> None:
        """Commit the cached witness's tokens at the masks from the frontier to its end (inside the view); with no
        witness reaching past the frontier, the frontier's own x0 (its logits were masked, so it is allowed)."""
        witness = self.witness[row]
        W = commit.shape[1]
        if witness is None or len(witness) <= f:
            commit[i, f - lo], tokens[i, f - lo] = True, step.x0[i, f - lo]
            return
        for p in range(f, min(len(witness), lo + W)):
            if canvas[p] == self.mask_id and bool(step.masked[i, p - lo]):
                commit[i, p - lo], tokens[i, p - lo] = True, witness[p]

    def _verify(self, i: int, row: int, lo: int, step: Any, canvas: list[int], f: int, state: Any,
                generator: torch.Generator | None) -> list[int] | None:
        if self.search == "beam":
            return beam_lookahead(self.proc, state, canvas, f, lo, step.logits[i], self.mask_id, self.eos,
                                  self.beam, generator)
        return self._lookahead(i, row, lo, step, canvas, f, state, generator)

    def _lookahead(self, i: int, row: int, lo: int, step: Any, canvas: list[int], f: int, state: Any,
                   generator: torch.Generator | None) -> list[int] | None:
        """A filling of the masks in [f, last committed] under which the canvas is a prefix the grammar can extend."""
        committed = [p for p in range(f, len(canvas)) if canvas[p] != self.mask_id]
        if not committed:
            return canvas[:f]
        last = committed[-1]
        holes = [p for p in range(f, last + 1) if canvas[p] == self.mask_id]
        witness = self.witness[row]
        W = step.x0.shape[1]
        draws: torch.Tensor | None = None
        inview = [p for p in holes if 0 <= p - lo < W]
        if len(inview) == len(holes) and holes and self.lookahead > 1:
            probs = step.logits[i, torch.tensor([p - lo for p in holes])].double().softmax(-1)
            draws = torch.multinomial(probs.float(), self.lookahead - 1, replacement=True, generator=generator)
        for c in range(self.lookahead):
            fill = list(canvas[: last + 1])
            for h, p in enumerate(holes):
                if c == 0:
                    cached = witness[p] if witness is not None and p < len(witness) else None
                    fill[p] = cached if cached is not None else (int(step.x0[i, p - lo]) if 0 <= p - lo < W else -1)
                elif draws is not None:
                    fill[p] = int(draws[h, c - 1])
                else:
                    return None
            if any(t < 0 for t in fill):
                continue
            region = fill[f:]
            end = next((k + 1 for k, t in enumerate(region) if t in self.eos), len(region))
            if self.proc.valid_prefix(state, region[:end]) == end:
                return fill
            if c == 0 and draws is None:
                return None
        return None
