"""What each logit row has seen: the committed tokens of its sequence, plus drafted tokens before it.

`History` holds the committed tokens (prompt + accepted output) of R sequences as a `[R, V]` bool seen mask,
updated in place as tokens are accepted (O(tokens) per step, never rebuilt). `Positions` names, for N logit
rows, which sequence each extends and which drafted tokens it has seen on top: nothing for the ar picker (one
logit row per sequence), the path from the root for speculative verification (logit row 0 is the root, row
i + 1 follows draft node i and has seen the drafted tokens of node i's path, node i included). The `[N, V]`
mask is built only when a processor asks for it (`Positions.seen()`), so processors that need no history
cost nothing.

Stateful processors (the grammar mask, constraints/processor.py) keep their committed per-sequence state in the
History, which advances it in `append` / `extend`; per-position states are derived from it along `Positions.paths`.
See `pipeline.StatefulProcessor`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch


class History:
    """Committed tokens of R sequences: `seen [R, V]` bool, and the committed state of each stateful processor."""

    def __init__(self, seen: torch.Tensor, stateful: Sequence[Any] = ()) -> None:
        self.seen = seen  # [R, V] bool; may be shared with (and updated by) the caller
        self.states: dict[Any, list[Any]] = {}
        for proc in stateful:
            self.states[proc] = [proc.start() for _ in range(seen.shape[0])]

    @classmethod
    def from_ids(cls, ids: torch.Tensor, vocab_size: int, mask: torch.Tensor | None = None,
                 stateful: Sequence[Any] = ()) -> History:
        """`[R, L]` token ids (padding where `mask` is 0 does not count as seen) -> their History."""
        ids = torch.as_tensor(ids, dtype=torch.long)
        if ids.dim() == 1:
            ids = ids[None]
        seen = torch.zeros(ids.shape[0], vocab_size, dtype=torch.bool, device=ids.device)
        keep = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.to(ids.device).bool()
        seen.scatter_(1, ids, keep)
        hist = cls(seen, stateful)
        for proc, states in hist.states.items():
            for r in range(ids.shape[0]):
                prompt = ids[r][keep[r]].tolist()
                if hasattr(proc, "begin"):  # a processor that constrains only the output (the grammar mask)
                    states[r] = proc.begin(prompt)
                    continue
                for t in prompt:
                    states[r] = proc.advance(states[r], t)
        return hist

    @property
    def size(self) -> int:
        return self.seen.shape[0]

    def append(self, tokens: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """One committed token per row (`[R]`, or `[len(rows)]` for the given rows)."""
        rows = torch.arange(self.size, device=self.seen.device) if rows is None else rows.to(self.seen.device)
        tokens = tokens.to(self.seen.device)
        self.seen[rows, tokens] = True
        for proc, states in self.states.items():
            for r, t in zip(rows.tolist(), tokens.tolist(), strict=True):
                states[r] = proc.advance(states[r], t)

    def extend(self, row: int, tokens: Sequence[int]) -> None:
        """Tokens committed to one row (the accepted tokens of a speculative step)."""
        tokens = list(tokens)
        if not tokens:
            return
        self.seen[row, torch.tensor(tokens, dtype=torch.long, device=self.seen.device)] = True
        for proc, states in self.states.items():
            for t in tokens:
                states[row] = proc.advance(states[row], t)

    def resize(self, rows: int) -> None:
        """Keep the first `rows` sequences; new ones have seen nothing and start every stateful processor afresh
        (the slots of a running batch that grows or drops its last rows: `ar.driver.ARSession`)."""
        keep = min(rows, self.size)
        seen = self.seen.new_zeros(rows, *self.seen.shape[1:])
        seen[:keep] = self.seen[:keep]
        self.seen = seen
        for proc, states in self.states.items():
            self.states[proc] = states[:keep] + [proc.start() for _ in range(rows - keep)]

    def adopt(self, row: int, other: History, other_row: int) -> None:
        """Row `row` takes over `other`'s row `other_row` (its seen tokens and committed states): a sequence that
        joins a running batch (`ar.driver.ARSession`)."""
        self.seen[row] = other.seen[other_row].to(self.seen.device)
        for proc, states in self.states.items():
            states[row] = other.states[proc][other_row]

    def rows(self, rows: torch.Tensor | Sequence[int] | None = None) -> Positions:
        """One logit row per sequence (the ar picker): position n has seen exactly row `rows[n]`'s tokens."""
        idx = torch.arange(self.size) if rows is None else torch.as_tensor(rows, dtype=torch.long)
        return Positions(self, idx.to(self.seen.device), None, whole=rows is None)

    def draft(self, row: int, drafted: torch.Tensor | Sequence[int], parents: Sequence[int] | None = None) -> Positions:
        """The k + 1 verification positions of a draft of row `row`: a chain, or a tree (`parents[i]` the parent
        node of node i, -1 the root, parents first). Position 0 (the root) has seen the row's committed tokens;
        position i + 1 in addition the drafted tokens on the path root -> node i, node i included."""
        tokens = drafted.tolist() if isinstance(drafted, torch.Tensor) else list(drafted)
        paths: list[tuple[int, ...]] = [()]
        for i, t in enumerate(tokens):
            up = -1 if parents is None else parents[i]
            paths.append(paths[(i - 1 if parents is None else up) + 1] + (t,))
        idx = torch.full((len(paths),), row, dtype=torch.long, device=self.seen.device)
        return Positions(self, idx, tuple(paths))


@dataclass(frozen=True, eq=False)
class Positions:
    """N logit rows: the sequence each extends (`rows [N]`) and the drafted tokens it has seen on top (`paths`,
    root first; None = nothing drafted). Positions of different sequences of one History concatenate (`cat`),
    so a batched verification can process every row's draft in one call."""

    history: History
    rows: torch.Tensor  # [N] long
    paths: tuple[tuple[int, ...], ...] | None = None
    whole: bool = field(default=False, repr=False)  # rows == arange(R): seen() may return the History's mask itself

    def __len__(self) -> int:
        return self.rows.numel()

    @staticmethod
    def cat(parts: Sequence[Positions]) -> Positions:
        history = parts[0].history
        assert all(p.history is history for p in parts), "positions of different histories"
        paths = None
        if any(p.paths is not None for p in parts):
            paths = tuple(path for p in parts for path in (p.paths or ((),) * len(p)))
        return Positions(history, torch.cat([p.rows for p in parts]), paths)

    def seen(self) -> torch.Tensor:
        """`[N, V]` bool: the tokens each position has seen (committed + drafted before it). Read-only."""
        return self._seen

    @cached_property
    def _seen(self) -> torch.Tensor:
        if self.paths is None and self.whole:
            return self.history.seen
        seen = self.history.seen[self.rows]  # a copy
        if self.paths is not None:
            pos = [n for n, path in enumerate(self.paths) for _ in path]
            tok = [t for path in self.paths for t in path]
            if tok:
                seen[torch.tensor(pos, device=seen.device), torch.tensor(tok, device=seen.device)] = True
        return seen

    def states(self, proc: Any) -> list[Any]:
        """The state of a stateful processor at each position: its row's committed state advanced along the
        position's drafted path (prefixes shared along a chain or tree). Nothing is mutated, so rejected drafts
        need no rollback."""
        committed = self.history.states[proc]
        out: list[Any] = []
        memo: dict[tuple[int, tuple[int, ...]], Any] = {}
        for n, r in enumerate(self.rows.tolist()):
            path = self.paths[n] if self.paths is not None else ()
            key = (r, path)
            if key not in memo:
                if path and (r, path[:-1]) in memo:
                    state = proc.advance(memo[(r, path[:-1])], path[-1])
                else:
                    state = committed[r]
                    for t in path:
                        state = proc.advance(state, t)
                memo[key] = state
            out.append(memo[key])
        return out
