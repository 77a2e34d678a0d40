"""The session contract: a running batch that rows join and leave between steps (continuous batching).

`fastdecode serve` drives every method that declares a session (`register(..., session=...)`) through this protocol
alone, so it never needs to know which family made it: `ar.driver.ARSession` (one forward per token) and
`speculative.driver.SpecSession` (one verification forward per step) both satisfy it.

The loop a server runs::

    slots = session.join(ids, mask, max_new_tokens)   # left-padded prompts [R, L] take free slots
    while session.running:
        for slot, index, token, finished in session.step():
            ...                                         # token `index` of the row in `slot`
        drafted = session.counts                        # {slot: (proposed, accepted)} of that step
        session.leave(slot)                             # a row that must stop now (a stop string, a client gone)
        if session.room: session.join(...)              # rows that arrived meanwhile

A row's tokens never depend on the other rows in the session, so a row that joins late gets what a run of its own
would give (greedy). A row that finishes (EOS, its `max_new_tokens`) leaves by itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from .types import PromptBatch

# (slot, index, token, finished): token `index` (its offset in the row's output) of the row in `slot`; `finished`:
# the row's last token, after which it has left its slot
Step = tuple[int, int, int, bool]


@runtime_checkable
class Session(Protocol):
    """Up to `max_slots` rows decoded together; rows join and leave between steps."""

    max_slots: int  # the most rows at once (a server may raise it before the first join)

    @property
    def running(self) -> int:
        """Rows in the session now."""
        ...

    @property
    def room(self) -> int:
        """Rows that may join now (0 where this session cannot take rows after its first ones)."""
        ...

    @property
    def counts(self) -> Mapping[int, tuple[int, int]]:
        """Per slot, `(proposed, accepted)` draft tokens of the last step (empty for a method that does not draft)."""
        ...

    def join(self, ids: torch.Tensor, mask: torch.Tensor | None = None, max_new_tokens: int | None = None) -> list[int]:
        """Take left-padded prompts `[R, L]` (`mask` `[R, L]`, 0 at padding) into free slots, each with its own token
        budget (`max_new_tokens`, None: the method config's); returns their slots in order. Raises ValueError where
        they do not fit (`room`)."""
        ...

    def leave(self, slot: int) -> None:
        """The row in `slot` stops now (nothing if it has left already); its slot is free for a later join."""
        ...

    def step(self) -> list[Step]:
        """One step for every running row: each token it committed, in order; [] when no row runs."""
        ...


# How a method's requests join a running batch: (model, cfg, ctx, slots) -> a Session with room for `slots` rows and
# none yet, or None where this request cannot join (a sparse attention rule, a drafter on the target's own cache, a
# model on transformers' own cache). `ctx` is the request's `registry.RunContext`.
SessionFactory = Callable[[Any, Any, Any, int], "Session | None"]


def driver_session(driver: Callable[[Any, PromptBatch, Any, Any], object]) -> SessionFactory:
    """The factory of a method whose driver returns a Session itself (every spec.* driver returns its
    `SpecSession`): the driver runs on a one-token seed row that leaves at once, so that the session is checked and
    built exactly as a run of that method is; None where the session it gives cannot take rows (`room` 0)."""

    def make(model: Any, cfg: Any, ctx: Any, slots: int) -> Session | None:
        seed = torch.tensor([[model.pad_token_id]], dtype=torch.long)  # [1, 1]
        session = driver(model, PromptBatch(seed, torch.ones_like(seed), (1,)), cfg, ctx)
        if not isinstance(session, Session):
            return None
        session.leave(0)  # the seed row: every request's rows join like any other's
        session.max_slots = slots
        return session if session.room else None

    return make
