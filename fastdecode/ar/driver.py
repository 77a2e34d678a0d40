"""The autoregressive driver: prefill, then one forward per token for all rows, with the KV cache.

`ARSession` is the step-wise form: a fixed number of slots (rows) sharing one KV cache, into which rows JOIN
between steps (`join`: the new rows are prefilled in a forward of their own and their keys and values copied into
free slots, `KVCache.adopt`) and which they LEAVE between steps (`leave`, or by themselves at EOS or their token
budget: the slot's columns are dropped and it is padding in later forwards until another row takes it). Each step
(`step`) feeds every running row its last token in one forward and picks every row's next token. A row's tokens do
not depend on which other rows share the session (each row attends only to its own columns), so a row that joins
late gets exactly the tokens of a run of its own (greedy; a sampler's shared generator is drawn for every slot each
step). `autoregressive()` (ar.greedy, ar.sample) is a session that all rows join at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ..attention import SparseSelector, is_dense
from ..cache import DynamicKVCache, KVCache
from ..config import MethodConfig
from ..models.capabilities import attention_free
from ..models.causal import CausalLM
from ..models.exact import MARGIN
from ..registry import RunContext
from ..sampling.history import History
from ..sampling.pipeline import LogitsPipeline
from ..types import PromptBatch, StepEvent


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids `[B, L]` for a left-padded mask: 0 at each row's first real token."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


class ARSession:
    """Up to `slots` rows decoded together, one forward per step; rows join and leave between steps (a
    `session.Session`, which `fastdecode serve` drives through `ar_session`).

    `join(ids, mask)` takes left-padded prompts `[R, L]` into free slots and returns the slots; `step()` returns
    `(slot, index, token, finished)` for every running row (`index`: the token's offset in that row's output); a
    row that finishes (EOS, its `max_new_tokens`) leaves by itself; `leave(slot)` drops a row at once. The forward
    covers slots 0 to the last one in use (the cache grows when rows join and drops free slots at its end), so a
    free slot in the middle is padding until a row that joins takes it (joins fill the lowest free slots).

    Joining a running session needs fastdecode's preallocated `KVCache` (`joinable`); on transformers' own cache
    (models the preallocated cache cannot serve) all rows join at once, before the first step, and stay in the
    forward (with the pad token) after they finish, as they always did.
    """

    def __init__(self, model: CausalLM, cfg: MethodConfig, slots: int, generator: torch.Generator | None = None,
                 capacity: int = 0, constraint: Any = None, sparse: SparseSelector | None = None) -> None:
        if slots < 1:
            raise ValueError(f"a session needs at least one slot, not {slots}")
        self.model, self.cfg, self.max_slots, self.generator = model, cfg, slots, generator
        self.capacity = capacity
        self.eos = set(model.eos_token_ids)
        # the constraint's grammar mask comes last in the pipeline; a sparse attention rule chooses the cached
        # columns every forward reads
        self.pipeline = LogitsPipeline.from_config(cfg, constraint=constraint)
        self.sparse = sparse
        # what each row has seen (padding not counted), kept only when a processor reads it
        self._keeps_history = self.pipeline.uses_history or bool(self.pipeline.stateful)
        self.history: History | None = None
        self.cache: KVCache | DynamicKVCache | None = None  # made by the first join, for its rows
        # A model without attention layers (Mamba, Mamba2) reads a mask only to zero the padding of the prompt:
        # after the prefill it gets none, as in transformers' generate() (Mamba's mixer would multiply the new
        # token's hidden state by a mask that covers the cached positions too, and broadcast it over all of them).
        # transformers' own cache needs the whole 2-D padding mask every step; the preallocated one keeps it per
        # column.
        self._attends = not attention_free(model)
        self._mask: torch.Tensor | None = None
        self.logits: torch.Tensor | None = None  # [size, V]: each running row's next-token logits
        self.next_pos = torch.zeros(0, 1, dtype=torch.long, device=model.device)  # [size, 1]
        self.occupied: list[bool] = []
        self.made: list[int] = []  # tokens each row has produced
        self.budget: list[int] = []
        self._feeds: list[bool] = []  # the slot's last pick is fed in the next forward
        self._fed: torch.Tensor | None = None  # [size] the last picks

    @property
    def joinable(self) -> bool:
        return self.cache is None or self.cache.ragged()

    @property
    def size(self) -> int:
        """Slots the forward covers now."""
        return len(self.occupied)

    @property
    def free(self) -> list[int]:
        return [s for s in range(self.size) if not self.occupied[s]]

    @property
    def running(self) -> int:
        return sum(self.occupied)

    @property
    def room(self) -> int:
        """Rows that may join now."""
        return self.max_slots - self.running if self.joinable else 0

    @property
    def counts(self) -> dict[int, tuple[int, int]]:
        """Draft counts of the last step (`session.Session`): none, ar.* does not draft."""
        return {}

    def _resize(self, n: int) -> None:
        """Cover slots 0 to n - 1 (the cache, the logits, the history and the per-slot lists follow)."""
        old = self.size
        keep = min(n, old)
        extra = n - keep
        assert self.cache is not None and self.cache.ragged()
        self.cache.resize(n)

        def fit(t: torch.Tensor) -> torch.Tensor:
            return torch.cat([t[:keep], t.new_zeros(extra, *t.shape[1:])]) if extra else t[:keep]

        if self.logits is not None:
            self.logits = fit(self.logits)
        self.next_pos = fit(self.next_pos)
        if self._fed is not None:
            self._fed = fit(self._fed)
        if self.history is not None:
            self.history.resize(n)
        for name, empty in (("occupied", False), ("made", 0), ("budget", 0), ("_feeds", False)):
            setattr(self, name, getattr(self, name)[:keep] + [empty] * extra)

    @torch.inference_mode()
    def join(self, ids: torch.Tensor, mask: torch.Tensor | None = None, max_new_tokens: int | None = None) -> list[int]:
        """Prefill left-padded prompts `[R, L]` (`mask` 0 at padding) and give each a free slot; returns the slots."""
        model = self.model
        device = model.device
        ids = torch.as_tensor(ids, dtype=torch.long).to(device)
        mask = torch.ones_like(ids) if mask is None else torch.as_tensor(mask).to(device)
        R = ids.shape[0]
        if R > self.room:
            if not self.joinable:
                raise ValueError(f"{model.name!r} runs on transformers' own cache, whose rows cannot join a running "
                                 "batch")
            raise ValueError(f"{R} rows cannot join a session with {self.room} of {self.max_slots} slots free")
        positions = positions_from_mask(mask)
        direct = self.cache is None  # the first rows prefill straight into the shared cache
        if direct:
            self.cache = model.new_cache(batch=R, capacity=self.capacity or ids.shape[1])
            self._resize_lists(R)
            target = self.cache
            take = list(range(R))
        else:
            free = self.free
            if len(free) < R:
                self._resize(self.size + R - len(free))
                free = self.free
            take = free[:R]
            target = model.new_cache(batch=R, capacity=ids.shape[1])
        if not direct and self.sparse is not None:
            raise ValueError("rows cannot join a running session that decodes with a sparse attention rule: its "
                             "summaries of the cache would not cover the adopted rows; start a new session")
        logits = model.forward(ids, positions, target, mask, num_logits=1, sparse=self.sparse)[:, -1]  # [R, V]
        if not direct:
            assert self.cache is not None
            for i, s in enumerate(take):
                self.cache.adopt(s, target, i)
        if self.logits is None:
            self.logits = logits.new_zeros(self.size, logits.shape[-1])
        idx = torch.tensor(take, dtype=torch.long, device=device)
        self.logits[idx] = logits
        self.next_pos[idx] = positions[:, -1:] + 1
        if direct and self._attends and not self.joinable:
            self._mask = mask
        if self._keeps_history:
            new = self.pipeline.history(ids, model.vocab_size, mask)
            if direct:
                self.history = new
            else:
                assert self.history is not None
                for i, s in enumerate(take):
                    self.history.adopt(s, new, i)
        budget = self.cfg.max_new_tokens if max_new_tokens is None else max_new_tokens
        for s in take:
            self.occupied[s], self.made[s], self.budget[s], self._feeds[s] = True, 0, budget, False
        return take

    def _resize_lists(self, n: int) -> None:
        self.occupied, self.made, self.budget, self._feeds = [False] * n, [0] * n, [0] * n, [False] * n
        self.next_pos = torch.zeros(n, 1, dtype=torch.long, device=self.model.device)

    @torch.inference_mode()
    def leave(self, slot: int) -> None:
        """The row in `slot` is dropped now; its slot is free for a row that joins later."""
        if slot >= self.size or not self.occupied[slot]:  # already gone (finished, or its slot was dropped)
            return
        self.occupied[slot] = self._feeds[slot] = False
        if self.cache is not None and self.cache.ragged():
            lengths = list(self.cache.lengths)
            lengths[slot] = 0
            self.cache.crop_rows(lengths)
            last = max((s for s in range(self.size) if self.occupied[s]), default=0)
            if last + 1 < self.size:
                self._resize(last + 1)  # free slots at the end leave the forward

    @torch.inference_mode()
    def step(self) -> list[tuple[int, int, int, bool]]:
        """One forward (the running rows' last tokens; none before the first step), then every running row's next
        token: `(slot, index, token, finished)`. A finished row has left when this returns."""
        if not any(self.occupied):
            return []
        self._forward()
        assert self.logits is not None
        at = self.history.rows() if self.history is not None else None
        token = self.pipeline.pick(self.logits, at, self.generator)  # [size]
        if self.history is not None:
            self.history.append(token)
        self._fed = token
        out = []
        for s, t in enumerate(token.tolist()):
            if s >= self.size or not self.occupied[s]:
                continue
            i = self.made[s]
            self.made[s] += 1
            finished = t in self.eos or self.made[s] >= self.budget[s]
            out.append((s, i, t, finished))
            if finished:
                self.leave(s)
            else:
                self._feeds[s] = True
        return out

    def _forward(self) -> None:
        """Feed each row picked last step (and still here) its token; other slots are padding that leaves no trace."""
        feeds = [f and o for f, o in zip(self._feeds, self.occupied, strict=True)]
        if not any(feeds) or self._fed is None:
            return
        model = self.model
        if all(feeds) and self.cache is not None and self.cache.ragged():
            # every slot runs (the common step): no padding to mask or keep, three tensor operations here
            self.logits = model.forward(self._fed[:, None], self.next_pos, self.cache, sparse=self.sparse)[:, -1]
            self.next_pos = self.next_pos + 1
            self._feeds = [False] * self.size
            return
        device = model.device
        real = torch.tensor(feeds, dtype=torch.bool, device=device)
        token = torch.where(real, self._fed, model.pad_token_id)
        if self.cache is not None and self.cache.ragged():
            before = list(self.cache.lengths)
            mask = None if all(feeds) else real[:, None]
            logits = model.forward(token[:, None], self.next_pos, self.cache, mask, sparse=self.sparse)[:, -1]
            if not all(feeds):  # padding slots (free, or joined since the last step) keep what they held
                self.cache.crop_rows([n + 1 if f else n for n, f in zip(before, feeds, strict=True)])
        else:  # every row joined at once; a finished row rides along with the pad token, as a real one
            if self._mask is not None:
                self._mask = torch.cat([self._mask, torch.ones_like(self._mask[:, :1])], dim=1)
            logits = model.forward(token[:, None], self.next_pos, self.cache, self._mask, sparse=self.sparse)[:, -1]
        assert self.logits is not None
        self.logits = torch.where(real[:, None], logits, self.logits)
        self.next_pos = self.next_pos + real[:, None].long()
        self._feeds = [False] * self.size


def autoregressive(
    model: CausalLM, batch: PromptBatch, cfg: MethodConfig, generator: torch.Generator | None = None,
    constraint: Any = None, sparse: SparseSelector | None = None,
) -> Iterator[StepEvent]:
    """Every row's next token from the request's logits pipeline (`cfg`'s processors, argmax or a draw; the
    `constraint`'s grammar mask last); with `sparse` (an `attention=` rule's selector) every forward reads the
    cached columns the rule selects."""
    B = batch.size
    session = ARSession(model, cfg, slots=B, generator=generator,
                        capacity=batch.input_ids.shape[1] + cfg.max_new_tokens + MARGIN, constraint=constraint,
                        sparse=sparse)
    session.join(batch.input_ids, batch.attention_mask)
    step = 0
    while True:
        picked = session.step()
        if not picked:
            return
        tokens: list[tuple[tuple[int, int], ...]] = [()] * B
        finished = [True] * B
        for s, i, t, fin in picked:
            tokens[s], finished[s] = ((i, t),), fin
        yield StepEvent(index=step, tokens=tuple(tokens), finished=tuple(finished))
        step += 1


def ar_session(model: CausalLM, cfg: MethodConfig, ctx: RunContext, slots: int) -> ARSession | None:
    """How an ar.greedy / ar.sample request joins a running batch (`register(..., session=...)`): an `ARSession` with
    room for `slots` rows; None where rows cannot join it: a model on transformers' own cache, or a sparse attention
    rule (its summaries of the cache would not cover the adopted rows)."""
    if not model.preallocated or not is_dense(getattr(cfg, "attention", None)):
        return None
    return ARSession(model, cfg, slots=slots, generator=ctx.generator)
