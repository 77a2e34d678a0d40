"""The one speculative driver: propose -> verify in one target forward -> accept -> roll the cache back -> observe.

Every drafter, chain or tree, runs through `speculative()`. Rows of a batch advance in lock step, one target
forward per row and step, each row with its own KV cache and drafter, so no row ever sees another row's
padding and a batched run equals the one-by-one runs token for token. What a drafter is and declares (its
capabilities, `Draft`, `Verification`) is `drafter.py`; this file only runs the loop.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..attention import SparseSelector, make_selector
from ..errors import IncompatibleMethodError
from ..models.base import on_host
from ..models.capabilities import sliding_windows, state_layer_types, uses_alibi
from ..models.causal import CausalLM, CausalOutput
from ..models.exact import MARGIN
from ..registry import RunContext
from ..sampling.pipeline import LogitsPipeline
from ..sampling.samplers import make_generator
from ..types import PromptBatch, StepEvent
from .drafter import Draft, Drafter, DrafterFactory, Side, SpecConfig, Verification
from .tree import (
    DeviceTree,
    ancestor_mask,
    branch_first,
    first_branch_prefix,
    node_depths,
    reorder,
    tree_greedy_reading,
    verify_tree_rsd,
    verify_tree_sampling,
)
from .verify import Acceptance, Reading, Verdict, greedy_reading, read_all, verify_sampling


def check_rollback(model: CausalLM) -> None:
    """Refuse a model whose cache cannot drop rejected draft positions, naming the layers that block it."""
    states = state_layer_types(model)
    if states:
        raise IncompatibleMethodError(
            f"Speculative methods roll the cache back after each verification, but {model.name!r} has recurrent "
            f"state-space layers ({', '.join(states)}) whose state cannot roll back to an earlier position. "
            "Use ar.greedy / ar.sample with this model."
        )
    cache = model.new_cache()
    if not cache.can_rollback():
        windows = sliding_windows(model)
        sizes = ", ".join(sorted({str(w) for w in windows.values()}))
        kind = type(getattr(cache, "hf", cache)).__name__
        why = (f"sliding-window attention layers (window {sizes} on layers {', '.join(map(str, windows))}), whose "
               f"cache ({kind}) drops old positions and cannot roll back"
               if windows else f"a cache ({kind}) that cannot roll back")
        raise IncompatibleMethodError(
            f"Speculative methods roll the KV cache back after each verification, but {model.name!r} has {why}. "
            "Use ar.greedy / ar.sample with this model."
        )


def check_tree_attention(model: CausalLM, role: str = "target") -> None:
    """Refuse tree drafts on a model that cannot take their positions: ALiBi (Bloom) counts key positions along a
    2D padding mask and has no position ids, so a tree node's depth cannot be given and a 4D tree mask is refused."""
    if uses_alibi(model):
        raise IncompatibleMethodError(
            f"This method verifies draft trees under a tree attention mask, but the {role} {model.name!r} "
            f"({type(model.model).__name__}) uses ALiBi attention, which takes its positions from a 2D padding mask "
            "and cannot place tree nodes by depth. Use a chain method (spec.pld, spec.ngram, spec.draft_model, "
            "spec.jacobi, spec.suffix without tree=True) with this model."
        )


def speculative(
    model: CausalLM, batch: PromptBatch, cfg: SpecConfig, ctx: RunContext, new_drafter: DrafterFactory,
    accept: Acceptance | None = None,
) -> SpecSession:
    """Check the model, then return the session whose iteration yields the batch's step events (errors surface
    before the first step). `accept` replaces speculative sampling's rule for chain drafts at temperature > 0 (a
    lossy, relaxed acceptance such as LANTERN's; greedy verification is never replaced).

    On the preallocated cache every row of the batch is verified in one target forward per step (rows with their
    own lengths, drafts and acceptance; shorter rows padded); a model on transformers' own cache verifies row by row.
    """
    check_rollback(model)
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    rows = [_Row(model, batch.row(b), cfg, new_drafter(generator), generator, ctx.constraint, accept)
            for b in range(batch.size)]
    if any(r.drafter.tree_drafts for r in rows):
        check_tree_attention(model)
        if isinstance(ctx.draft, CausalLM):  # a draft model that grows the tree itself runs tree masks too
            check_tree_attention(ctx.draft, "draft model")
    room = max(len(r.prompt) for r in rows) + cfg.max_new_tokens + MARGIN  # (the capacity ar.greedy's cache has)
    # a drafter that runs the target on the target's own cache (spec.sparse_self) needs a cache of its row alone
    shared = any(r.drafter.shares_target_cache for r in rows)
    if model.preallocated and not shared:
        groups = [_Group(model, rows, model.new_cache(batch=len(rows), capacity=room))]
    else:
        groups = [_Group(model, [r], model.new_cache(capacity=room) if model.preallocated else model.new_cache())
                  for r in rows]
    for group in groups:
        group.sparse = make_selector(cfg.attention, model)
        for r in group.rows:
            if shared:  # the drafter's rule may watch the dense verification forwards (it never selects in them)
                watch = r.drafter.bind(group.cache)
                group.sparse = group.sparse or watch
    return SpecSession(model, cfg, rows, groups, new_drafter, generator, ctx.constraint, accept)


class SpecSession:
    """The rows of a speculative run; iterating it yields their step events (what `generate()` reads).

    Where all rows share one preallocated cache (`joinable`), rows may also JOIN and LEAVE between steps, as
    `fastdecode serve` does: a joining row takes a finished row's slot (its cache length set to 0) or a new one (the
    cache grows a row); its prompt but the last token is prefilled in a forward of its own and copied into the slot
    (`KVCache.adopt`), the last token is the unseen context its block feeds in the next verification forward, beside
    the other rows' drafts; `leave` ends a row at once. A row's tokens never depend on the other rows (each
    attends only to its own columns), so a row that joins late gets what a run of its own would give (greedy).
    `step()` returns `(slot, index, token, finished)` for every token the step committed, and `counts` the step's
    `(proposed, accepted)` per slot: the `session.Session` contract, which `fastdecode serve` drives (spec.* methods
    declare `register(..., session="driver")`: their driver's SpecSession, seeded with one row that leaves at once).
    """

    def __init__(self, model: CausalLM, cfg: SpecConfig, rows: list[_Row], groups: list[_Group],
                 new_drafter: DrafterFactory, generator: torch.Generator | None, constraint: Any = None,
                 accept: Acceptance | None = None) -> None:
        self.model, self.cfg, self.rows, self.groups = model, cfg, rows, groups
        self.new_drafter, self.generator, self.constraint = new_drafter, generator, constraint
        self.accept = accept
        self.counts: dict[int, tuple[int, int]] = {}
        self.max_slots = len(rows)
        self._events: Iterator[StepEvent] | None = None

    def __iter__(self) -> Iterator[StepEvent]:
        return self

    def __next__(self) -> StepEvent:
        if self._events is None:
            self._events = _steps(self.rows, self.groups)
        return next(self._events)

    @property
    def joinable(self) -> bool:
        return len(self.groups) == 1 and self.groups[0].cache.ragged() and self.groups[0].sparse is None \
            and not any(r.drafter.shares_target_cache for r in self.rows)

    @property
    def running(self) -> int:
        return sum(not r.done for r in self.groups[0].rows) if self.joinable else 0

    @property
    def room(self) -> int:
        return self.max_slots - self.running if self.joinable else 0

    def join(self, ids: torch.Tensor, mask: torch.Tensor | None = None, max_new_tokens: int | None = None) -> list[int]:
        """Rows for left-padded prompts `[R, L]` (`mask` 0 at padding), each in a free slot; returns the slots."""
        if not self.joinable:
            raise ValueError("rows cannot join this speculative run: it does not verify all rows over one "
                             "preallocated cache (transformers' own cache, a sparse rule, or a drafter sharing the "
                             "target's cache)")
        ids = torch.as_tensor(ids, dtype=torch.long).cpu()
        mask = torch.ones_like(ids) if mask is None else torch.as_tensor(mask).cpu()
        if ids.shape[0] > self.room:
            raise ValueError(f"{ids.shape[0]} rows cannot join a session with {self.room} slots free")
        cfg = self.cfg if max_new_tokens is None else dataclasses.replace(self.cfg, max_new_tokens=max_new_tokens)
        group = self.groups[0]
        cache = group.cache
        slots = []
        for prompt_ids, real in zip(ids, mask, strict=True):
            row = _Row(self.model, prompt_ids[real.bool()].tolist(), cfg, self.new_drafter(self.generator),
                       self.generator, self.constraint, self.accept)
            free = next((i for i, r in enumerate(group.rows) if r.done), None)
            if free is None:
                cache.resize(len(group.rows) + 1)
                group.rows.append(row)
                free = len(group.rows) - 1
            else:
                group.rows[free] = row
                lengths = list(cache.lengths)
                lengths[free] = 0  # the slot's old entries are never seen again
                cache.crop_rows(lengths)
            if row.n > 1:
                # the prompt but its last token is prefilled in a forward of its own and copied into the slot, so the
                # next verification forward is not padded to a whole prompt for every row; the last token is the
                # row's unseen context there
                alone = self.model.new_cache(batch=1, capacity=row.n)
                with torch.inference_mode():
                    self.model.forward(row.ids[None, : row.n - 1].to(self.model.device),
                                       torch.arange(row.n - 1, device=self.model.device)[None], alone, num_logits=1)
                cache.adopt(free, alone, 0)
            slots.append(free)
        return slots

    def leave(self, slot: int) -> None:
        """The row in `slot` ends now; the slot is free for a row that joins later."""
        rows = self.groups[0].rows
        if slot < len(rows) and not rows[slot].done:
            rows[slot].done = True

    def step(self) -> list[tuple[int, int, int, bool]]:
        """One verification forward for every running row: `(slot, index, token, finished)` per committed token."""
        group = self.groups[0]
        self.counts = {}
        if not any(not r.done for r in group.rows):
            return []
        outs = group.step()
        picked = []
        for slot, row in enumerate(group.rows):
            out = outs.get(id(row))
            if out is None:
                continue
            self.counts[slot] = (out.proposed, out.accepted)
            for j, (index, token) in enumerate(out.tokens):
                picked.append((slot, index, token, row.done and j == len(out.tokens) - 1))
        return picked


def _steps(rows: list[_Row], groups: list[_Group]) -> Iterator[StepEvent]:
    index = 0
    while not all(r.done for r in rows):
        outs: dict[int, _Out] = {}
        forwards = 0
        for group in groups:
            if not all(r.done for r in group.rows):
                got = group.step()
                outs.update(got)
                # groups run side by side; a group that confirmed a tree path ran one forward more
                forwards = max(forwards, 1 + any(o.confirmed for o in got.values()))
        per_row = [outs.get(id(r), _Out()) for r in rows]
        yield StepEvent(
            index=index,
            tokens=tuple(o.tokens for o in per_row),
            forwards=forwards,
            # a batched drafter would run until its longest row is drafted
            draft_forwards=max(o.draft_forwards for o in per_row),
            proposed=tuple(o.proposed for o in per_row),
            accepted=tuple(o.accepted for o in per_row),
            finished=tuple(r.done for r in rows),
            draft_s=tuple(o.draft_s for o in per_row),
            verify_s=tuple(o.verify_s for o in per_row),
        )
        index += 1


@dataclass
class _Out:
    tokens: tuple[tuple[int, int], ...] = ()
    proposed: int = 0
    accepted: int = 0
    draft_forwards: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    confirmed: bool = False  # its tree path was confirmed by one more target forward (`_Group._confirm`)


class _Stopwatch:
    """The phase times of a speculative step (`draft_s`, `verify_s`) without synchronising the host with the device
    (issue #30: at most one synchronisation a step, the verdict's read). On CUDA a mark is an event recorded on the
    current stream, and the time between two marks the stream's: the device's work between them and its idle gaps
    while the host worked (a host drafter's time, the read of the verdict), so work queued by one phase counts in that
    phase, not in the next that waits for it. Elsewhere the host's clock. `seconds` waits for its later mark: the
    driver asks only after the step's verdict was read back, when every earlier mark has passed and the later ones
    wait for nothing but the step's own bookkeeping."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def seconds(self, start: Any, end: Any) -> float:
        if not self.cuda:
            return float(end - start)
        end.synchronize()  # (the event alone, never the device)
        return start.elapsed_time(end) / 1000.0


def _where(blocks: list[_Block]) -> torch.device:
    """Where the blocks' ids are: on the host, or on the device where a drafter left its drafts unread
    (`_Row.block`)."""
    return next((b.tokens.device for b in blocks if not on_host(b.tokens.device)), torch.device("cpu"))


def _causal(n: int) -> torch.Tensor:
    """`[n, n]` bool, plain causal: a chain's block (or its pending context's part)."""
    return torch.ones(n, n, dtype=torch.bool).tril()


def _onto(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` on `device`; a copy from the host to a GPU does not wait for the device (CUDA takes a pageable source in
    before it returns, and the kernels that read it follow on the stream), so a step's one synchronisation stays the
    verdict's read. A copy to the host waits, as it must before the host reads it."""
    return t.to(device, non_blocking=on_host(t.device) and not on_host(device))


@dataclass
class _Block:
    """One row's part of a verification forward: the unseen context, the draft and its side tokens."""

    tokens: torch.Tensor  # [T_b] long
    positions: torch.Tensor  # [T_b] long
    visible: torch.Tensor | None  # [T_b, T_b] bool; None: plain causal (a chain draft, no side tokens)
    pending: int  # P: context tokens the cache has not seen (the first P of `tokens`)

    @property
    def chain(self) -> bool:
        return self.visible is None


class _Group:
    """Rows verified together in one target forward over one cache (one row each on transformers' caches)."""

    def __init__(self, model: CausalLM, rows: list[_Row], cache) -> None:
        self.model, self.rows, self.cache = model, rows, cache
        self.sparse: SparseSelector | None = None  # the target's sparse attention rule (SpecConfig.attention)
        self.watch = _Stopwatch(model.device)

    def step(self) -> dict[int, _Out]:
        watch = self.watch
        base = list(self.cache.lengths)
        # 1. every active row drafts
        drafts: list[Draft | None] = []
        blocks: list[_Block | None] = []
        drafting: list[tuple[Any, Any] | None] = []  # each row's marks around its drafting (`_Stopwatch`)
        before = [r.drafter.forwards for r in self.rows]
        for row, cached in zip(self.rows, base, strict=True):
            if row.done:
                drafts.append(None)
                blocks.append(None)
                drafting.append(None)
                continue
            t0 = watch.mark()
            proposed = row.propose()
            drafting.append((t0, watch.mark()))
            drafts.append(proposed)
            blocks.append(row.block(proposed, cached))

        # 2. one forward over every row's block, padded to the longest (padding sees only itself)
        t1 = watch.mark()
        live = [r.drafter for r, blk in zip(self.rows, blocks, strict=True) if blk is not None]
        asked = tuple(dict.fromkeys(i for d in live for i in d.hidden_layers))  # intermediate layers any row reads
        needs: bool | tuple[int, ...] = asked or any(d.needs_hidden for d in live)
        fwd, first = self._forward(blocks, needs)
        # [B, T - first, V], [B, T, H], {layer: [B, T, H]}
        logits, hidden, layers = ((fwd.logits, fwd.hidden, dict(zip(asked, fwd.layers, strict=True)))
                                  if isinstance(fwd, CausalOutput) else (fwd, None, {}))
        forward = (t1, watch.mark())  # (no wait for the forward: the verdicts' reads below do)

        # 3. each row's verdict on its slice (in row order: sampled verdicts draw from the run's generator)
        slices: dict[int, torch.Tensor] = {}
        got: dict[int, Reading | Verdict] = {}
        spent: list[list[tuple[Any, Any]]] = [[forward] for _ in self.rows]  # each row's verification marks
        for b, (row, draft, blk) in enumerate(zip(self.rows, drafts, blocks, strict=True)):
            if draft is None or blk is None:
                continue
            t2 = watch.mark()
            lo = blk.pending - 1 - first
            slices[b] = logits[b, lo : lo + 1 + blk.tokens.numel() - blk.pending]  # [1 + k + S, V]
            # the root's and the nodes' hidden states, for a drafter that reads them ([1 + k, H])
            nodes = (hidden[b, blk.pending - 1 : blk.pending + draft.tokens.numel()]
                     if hidden is not None and row.drafter.needs_hidden else None)
            got[b] = row.reading(draft, slices[b], reads=True, hidden=nodes)
            spent[b].append((t2, watch.mark()))
        verdicts = self._read(got, spent)
        for b, verdict in verdicts.items():  # a tree left on the device has its shape on the host now
            drafted = drafts[b]
            assert drafted is not None  # (a row with a verdict drafted)
            drafts[b] = self.rows[b].resolved(drafted, verdict)
        confirm = []  # rows whose tree path must be confirmed as a chain first (exact mode)
        for b, verdict in list(verdicts.items()):
            kept = self.rows[b].exact_verdict(drafts[b], verdict)
            if kept is None:
                confirm.append(b)
            else:
                verdicts[b] = kept

        # 4. each row keeps its tokens and rolls its part of the cache back; a confirmed row settles on the chain
        # forward's verdict instead, and keeps that forward's entries of its accepted prefix as a chain does
        outs: dict[int, _Out] = {}
        keep = list(base)

        def settle(b: int, chained: bool) -> None:
            row, draft, blk = self.rows[b], drafts[b], blocks[b]
            assert draft is not None and blk is not None
            t3 = watch.mark()
            n = blk.tokens.numel()
            out, keep[b] = row.settle(draft, verdicts[b], slices[b], base[b], blk.pending, chained,
                                      hidden[b, :n] if hidden is not None else None,
                                      {i: t[b, :n] for i, t in layers.items()})
            spent[b].append((t3, watch.mark()))
            marks = drafting[b]
            assert marks is not None  # (a row with a verdict drafted)
            out.draft_s = watch.seconds(*marks)
            out.verify_s = sum(watch.seconds(*pair) for pair in spent[b])
            out.draft_forwards = row.drafter.forwards - before[b]
            out.confirmed = chained
            outs[id(self.rows[b])] = out

        for b in verdicts:
            if b not in confirm:
                settle(b, False)
        if confirm:
            t4 = watch.mark()
            self.cache.crop_rows(keep)  # a confirmed row drops its whole tree, the others what they do not keep
            chained = self._confirm({b: (self.rows[b], verdicts[b]) for b in confirm}, base)
            again = (t4, watch.mark())  # shared by the confirmed rows, as the first forward is by all
            for b, verdict in chained.items():
                # (what the drafter asked of the tree's forward comes with it)
                tree = verdicts[b]
                verdicts[b] = dataclasses.replace(verdict, read=tree.read, nodes=tree.nodes[: verdict.accepted]
                                                  if tree.nodes is not None else None)
                spent[b].append(again)
                settle(b, True)
        self.cache.crop_rows(keep)
        return outs

    def _forward(self, blocks: list[_Block | None], hidden: bool | tuple[int, ...] = False
                 ) -> tuple[torch.Tensor | CausalOutput, int]:
        """One target forward over the rows' blocks (None: a row that feeds nothing), padded to the longest; returns
        its output from the earliest position any row reads on, and that position."""
        model, device = self.model, self.model.device
        T = max(b.tokens.numel() for b in blocks if b is not None)
        first = min(blk.pending - 1 for blk in blocks if blk is not None)  # the earliest logits any row reads
        # every row feeds a block of the same length: no padding, so the rows' own tensors are the block; chains all
        # of them: a plain causal block of real tokens, which needs no mask either (with CUDA graphs nothing but ids
        # and positions is copied to the device then; docs/gpu.md, "Host work per step")
        if all(blk is not None and blk.tokens.numel() == T for blk in blocks):
            fed = [blk for blk in blocks if blk is not None]
            vis = None
            if len(fed) == 1:
                inp, pos = fed[0].tokens[None], fed[0].positions[None]
                if fed[0].visible is not None:  # (not a chain)
                    vis = fed[0].visible[None]
            else:
                where = _where(fed)
                inp = torch.stack([_onto(blk.tokens, where) for blk in fed])
                pos = torch.stack([_onto(blk.positions, where) for blk in fed])
                if not all(blk.chain for blk in fed):
                    vis = torch.stack([_onto(_causal(T) if blk.visible is None else blk.visible, where)
                                       for blk in fed])
            fwd = model.forward(_onto(inp, device), _onto(pos, device), self.cache, None, num_logits=T - first,
                                visible=None if vis is None else _onto(vis, device), hidden=hidden,
                                sparse=self.sparse)
            return fwd, first
        B = len(self.rows)
        where = _where([b for b in blocks if b is not None])  # (the host, unless a drafter left its draft there)
        inp = torch.full((B, T), model.pad_token_id, dtype=torch.long, device=where)
        pos = torch.zeros(B, T, dtype=torch.long, device=where)
        vis = torch.zeros(B, T, T, dtype=torch.bool, device=where)
        real = torch.zeros(B, T, dtype=torch.long)
        for b, blk in enumerate(blocks):
            if blk is None:
                continue
            n = blk.tokens.numel()
            inp[b, :n] = _onto(blk.tokens, where)
            pos[b, :n] = _onto(blk.positions, where)
            real[b, :n] = 1
            vis[b, :n, :n] = _onto(_causal(n) if blk.visible is None else blk.visible, where)
            pos[b, n:] = pos[b, n - 1]
        fwd = model.forward(_onto(inp, device), _onto(pos, device), self.cache, _onto(real, device),
                            num_logits=T - first, visible=_onto(vis, device), hidden=hidden, sparse=self.sparse)
        return fwd, first

    def _read(self, got: dict[int, Reading | Verdict],
              spent: list[list[tuple[Any, Any]]] | None = None) -> dict[int, Verdict]:
        """Each row's verdict, in row order (a drafter's memory learns in it): the greedy ones' `Reading`s in one copy
        to the host (one synchronisation a step on a GPU, whatever the number of rows), its time in each such row's
        verification marks (`spent`); the others were decided as they drew."""
        pending = {b: r for b, r in got.items() if isinstance(r, Reading)}
        verdicts = {b: v for b, v in got.items() if isinstance(v, Verdict)}
        if pending:
            t = self.watch.mark()
            verdicts.update(zip(pending, read_all(list(pending.values())), strict=True))
            pair = (t, self.watch.mark())
            for b in pending:
                if spent is not None:
                    spent[b].append(pair)
        return dict(sorted(verdicts.items()))

    def _confirm(self, rows: dict[int, tuple[_Row, Verdict]], base: list[int]) -> dict[int, Verdict]:
        """Exact mode's check of greedy tree paths off the first branch (docs/gpu.md, "Trees on a GPU"): one more
        forward feeds each such row's pending tokens and accepted path as a plain causal block, at the columns a
        chain (and `ar.greedy`) gives those tokens, and the chain rule decides on its logits. The tree forward's
        logits of such a path were computed with siblings between its nodes, which a GPU's attention kernel sums in
        another order than consecutive columns, so a near-tie there could flip. The other rows feed nothing."""
        blocks: list[_Block | None] = [None] * len(self.rows)
        paths: dict[int, Draft] = {}
        for b, (row, verdict) in rows.items():
            paths[b] = Draft(torch.tensor(verdict.tokens[: verdict.accepted], dtype=torch.long))
            blocks[b] = row.block(paths[b], base[b])
        logits, first = self._forward(blocks)  # [B, T - first, V]
        assert isinstance(logits, torch.Tensor)
        got: dict[int, Reading | Verdict] = {}
        for b, (row, _) in rows.items():
            blk = blocks[b]
            assert blk is not None
            lo = blk.pending - 1 - first
            got[b] = row.reading(paths[b], logits[b, lo : lo + 1 + paths[b].tokens.numel()])  # [1 + a, V]
        return self._read(got)


class _Row:
    """One sequence: its context and its drafter (its cache entries live in its group's cache)."""

    def __init__(
        self, model: CausalLM, prompt: list[int], cfg: SpecConfig, drafter: Drafter, generator: torch.Generator | None,
        constraint: Any = None, accept: Acceptance | None = None,
    ) -> None:
        self.model, self.cfg, self.drafter, self.generator = model, cfg, drafter, generator
        self.accept = accept if accept is not None else verify_sampling  # a chain's rule at temperature > 0
        self.eos = model.eos_token_ids
        self.prompt = prompt
        self.prompt_len = len(prompt)
        self.ids = torch.tensor(prompt + [0] * cfg.max_new_tokens, dtype=torch.long)  # [L + max_new] context buffer
        self.n = len(prompt)  # tokens in the context
        self.done = False
        # the request's logits pipeline; the History of committed tokens only when a processor reads it
        self.pipeline = LogitsPipeline.from_config(cfg, constraint=constraint)
        self.grammar = self.pipeline.constraint  # the grammar mask, or None
        keep = self.pipeline.uses_history or self.pipeline.stateful
        self.history = (
            self.pipeline.history(torch.tensor([prompt]).to(model.device), model.vocab_size) if keep else None
        )
        self.in_history = len(prompt)  # context tokens the History holds (it catches up in `_verify`)
        # how `propose` reordered the last tree (None: as drafted); a tensor where the tree is on the device, until
        # its verdict reads it (`resolved`)
        self.order: list[int] | torch.Tensor | None = None

    def propose(self) -> Draft:
        made = self.n - self.prompt_len
        room = self.cfg.max_new_tokens - made - 1  # drafts beyond this could never be emitted
        draft = self.drafter.propose(self.ids[: self.n], room).as_chain() if room > 0 else Draft.empty()
        if self.history is not None:  # a grammar, or a processor that reads each node's history, sees the tree
            draft = draft.on_host()
        if self.grammar is not None and draft.parents is None and draft.tokens.numel():
            draft = self._cut(draft)
        assert draft.depth <= max(room, 0), (
            f"drafter proposed {draft.depth} tokens deep, more than the {room} asked for"
        )
        self.order = None
        if draft.parents is not None and self.model.exact is not None and self.cfg.greedy:
            # its first branch first, so the drafter's first-listed path sits where a chain would and needs no
            # confirmation (`exact_verdict`); the drafter is told the outcome in its own order (`_as_drafted`)
            order = branch_first(draft.parents)
            if isinstance(order, torch.Tensor):  # (a DeviceTree: reordered where it is, nothing read)
                assert isinstance(draft.parents, DeviceTree) and draft.probs is None
                self.order = order
                draft = Draft(draft.tokens[order], None, draft.parents.reordered(order), draft.side)
            elif order != list(range(len(order))):
                self.order = order
                at = torch.tensor(order, device=draft.tokens.device)
                assert isinstance(draft.parents, list)
                draft = Draft(draft.tokens[at], draft.probs[at.to(draft.probs.device)] if draft.probs is not None
                              else None, reorder(draft.parents, order), draft.side)
        return draft

    def resolved(self, draft: Draft, verdict: Verdict) -> Draft:
        """The draft with its tree's shape on the host once its verdict has read it (a `DeviceTree`'s parents, and
        the order `propose` gave it), for what follows the verdict (`exact_verdict`, `settle`)."""
        if not isinstance(draft.parents, DeviceTree):
            return draft
        assert verdict.parents is not None, "a tree left on the device is read with its verdict"
        if self.order is not None:
            self.order = verdict.order
        return dataclasses.replace(draft, parents=verdict.parents)

    def _as_drafted(self, rows: torch.Tensor, before: int) -> torch.Tensor:
        """`rows` (`[before + k + S, ...]`, the draft nodes after `before` rows) with the nodes back in the drafter's
        order, where `propose` reordered its tree."""
        if self.order is None:
            return rows
        # (a tensor before a tree left on the device is read: the rows put back where they are, nothing read)
        order = _onto(torch.as_tensor(self.order), rows.device)
        at = torch.arange(before, before + order.numel(), device=rows.device)
        return rows[torch.arange(rows.shape[0], device=rows.device).index_copy(0, before + order, at)]

    def _catch_up(self) -> None:
        """The History takes the tokens accepted since the last step."""
        if self.history is not None and self.in_history < self.n:
            self.history.extend(0, self.ids[self.in_history : self.n].tolist())
            self.in_history = self.n

    def _cut(self, chain: Draft) -> Draft:
        """A chain draft cut at its first token the grammar forbids. A deterministic drafter's chain ends before it
        (the target then emits its own token there, as after a rejection). A sampled drafter's chain keeps it: the
        masked target rejects it surely and draws from the residual max(p - q, 0), as the uncut draft would, so the
        output keeps exactly the target's masked distribution."""
        assert self.history is not None and self.grammar is not None
        self._catch_up()
        state = self.history.states[self.grammar][0]
        k = chain.tokens.numel()
        ok = self.grammar.valid_prefix(state, chain.tokens.tolist())
        keep = ok if chain.probs is None else min(ok + 1, k)
        if keep == k:
            return chain
        probs = chain.probs[:keep] if chain.probs is not None else None
        return Draft(chain.tokens[:keep], probs, None, chain.side)

    def block(self, draft: Draft, cached: int) -> _Block:
        """The tokens this row feeds: context after its `cached` entries, the draft, its side tokens."""
        n, k = self.n, draft.tokens.numel()
        P = n - cached
        side = draft.side
        # where the drafts are: a drafter that left them unread on the device (a draft model's greedy chain on a GPU)
        # gets its block built there, so that reading them waits for the verdict (`_Group._forward`)
        where = draft.tokens.device
        tokens = torch.cat([_onto(self.ids[n - P : n], where), draft.tokens]
                           + ([_onto(side.tokens, where)] if side else []))
        if draft.parents is None and side is None:  # a chain: plain causal attention
            return _Block(tokens, torch.arange(n - P, n + k), None, P)
        # a tree's mask and depths where its shape is (a DeviceTree: on the device, nothing read)
        tree = ancestor_mask(draft.parents) if draft.parents is not None else _causal(k)
        offsets = node_depths(draft.parents, tree) if draft.parents is not None else torch.arange(1, k + 1)
        on = offsets.device
        pos = torch.cat([_onto(torch.arange(n - P, n), on), n - 1 + offsets]
                        + ([_onto(self._side_positions(side), on)] if side else []))
        return _Block(tokens, pos, self._visible(P, draft, tree), P)

    def reading(self, draft: Draft, logits: torch.Tensor, reads: bool = False, hidden: torch.Tensor | None = None
                ) -> Reading | Verdict:
        """The verdict on `draft` from the `[1 + k + S, V]` logits of its forward (side tokens' rows unread): greedy,
        its `Reading`, which the group reads with the other rows' (`_Group._read`); else the verdict. `reads`: with
        what the drafter's `reads` asks of them (and of the root's and nodes' `[1 + k, H]` `hidden` states, for a
        drafter that needs them) (`Verdict.read`), in the verdict's read."""
        k = draft.tokens.numel()
        rows = self._as_drafted(hidden, 1) if hidden is not None else None
        also = self.drafter.reads(self._as_drafted(logits, 1), k, rows) if reads else None
        return self._verify(draft, logits[: k + 1], also)

    def exact_verdict(self, draft: Draft | None, verdict: Verdict) -> Verdict | None:
        """The verdict to keep, or None where it must first be confirmed as a chain (`_Group._confirm`).

        In exact mode a greedy tree verdict whose path leaves the tree's first branch (nodes 0..m-1, which sit where a
        chain's would) read rows with siblings among their keys, which a GPU's kernel can round otherwise. The path's
        first node off that branch was still decided by a first-branch row (or the context's), so the verdict can be
        cut there: `m` nodes accepted and that node in the place of the target's own token, `m + 1` tokens for no
        further forward. The confirmation keeps about `a + 1` for one more forward, so the cut is taken when it keeps
        at least half as many (docs/gpu.md, "Trees on a GPU"). Any other verdict is kept as it is."""
        if draft is None or draft.parents is None or self.model.exact is None or not self.cfg.greedy:
            return verdict
        path = verdict.tokens[: verdict.accepted]
        assert verdict.nodes is not None  # (a greedy tree verdict)
        assert isinstance(draft.parents, list)  # (`resolved`)
        m = first_branch_prefix(draft.parents, verdict.nodes)
        if m == len(path):
            return verdict
        if 2 * (m + 1) < verdict.accepted + 1:
            return None
        return Verdict(m, path[: m + 1], verdict.read, verdict.nodes[:m])

    def settle(self, draft: Draft, verdict: Verdict, logits: torch.Tensor, cached: int, P: int, chained: bool = False,
               hidden: torch.Tensor | None = None, layers: dict[int, torch.Tensor] | None = None) -> tuple[_Out, int]:
        """Keep the verdict's tokens up to the first EOS and tell the drafter, with the forward's `[1 + k + S, V]`
        logits (and the row's `[P + k + S, H]` hidden states, and its outputs of the decoder layers asked, for
        drafters that read them); returns the step's counts and how many cache entries of this row stay valid.
        `chained`: the verdict came from a chain forward of the accepted path (`_Group._confirm`), whose entries of
        the accepted prefix are in the cache."""
        made = self.n - self.prompt_len
        k = draft.tokens.numel()
        tokens = verdict.tokens[: self.cfg.max_new_tokens - made]
        cut = next((i + 1 for i, t in enumerate(tokens) if t in self.eos), len(tokens))
        tokens = tokens[:cut]
        start = self.n
        self.ids[start : start + len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        self.n += len(tokens)
        self.done = tokens[-1] in self.eos or self.n - self.prompt_len >= self.cfg.max_new_tokens
        # a chain keeps its accepted prefix in the cache; a tree's (or side tokens') entries are all dropped and the
        # accepted path is fed again with the next step
        plain = (draft.parents is None and draft.side is None) or chained
        kept = cached + P + (verdict.accepted if plain else 0)
        if self.done:
            self.drafter.finish(self.ids[: self.n])
        else:
            mine = tuple(self._as_drafted(layers[i], P) for i in self.drafter.hidden_layers) if layers else ()
            logits = self._as_drafted(logits, 1)
            hidden = self._as_drafted(hidden, P) if hidden is not None else None
            self.drafter.observe(Verification(verdict.accepted, tuple(tokens), logits, k, hidden, mine, verdict.read,
                                              self._drafted_nodes(verdict)))
        out = _Out(tokens=tuple((made + i, t) for i, t in enumerate(tokens)), proposed=k,
                   accepted=min(verdict.accepted, len(tokens)))
        return out, min(kept, start + len(tokens))

    def _drafted_nodes(self, verdict: Verdict) -> tuple[int, ...] | None:
        """A tree verdict's accepted nodes in the drafter's order (`Verification.nodes`)."""
        if verdict.nodes is None or self.order is None:
            return verdict.nodes
        assert isinstance(self.order, list)  # (`resolved`)
        return tuple(self.order[i] for i in verdict.nodes)

    def _side_positions(self, side: Side) -> torch.Tensor:
        """Side tokens are guesses far ahead; near the model's last position they share it (only guesses suffer)."""
        pos = self.n - 1 + side.offsets.cpu()
        limit = self.model.max_positions
        return pos.clamp(max=limit - 1) if limit is not None else pos

    def _visible(self, P: int, draft: Draft, tree: torch.Tensor) -> torch.Tensor:
        """`[Q, Q]` bool over the new tokens, where `tree` (the draft's `[k, k]` mask) is: pending tokens causal,
        tree nodes see their ancestors, side tokens theirs (and the whole context); the draft never sees side
        tokens."""
        k = draft.tokens.numel()
        S = draft.side.tokens.numel() if draft.side else 0
        Q = P + k + S
        on = tree.device
        allow = torch.zeros(Q, Q, dtype=torch.bool, device=on)
        allow[P:, :P] = True  # draft and side tokens see all the unseen context
        allow[:P, :P] = _onto(_causal(P), on)
        allow[P : P + k, P : P + k] = tree
        if draft.side is not None and S:
            allow[P + k :, P + k :] = _onto(draft.side.mask, on)
        return allow

    def _verify(self, draft: Draft, logits: torch.Tensor, also: torch.Tensor | None = None) -> Reading | Verdict:
        """The verdict on `draft` from the target's `[k + 1, V]` logits, each position through the request's pipeline
        with its own history: the committed context, plus the drafted tokens on its path (a tree node's ancestors);
        greedy, its `Reading`. `also` (integers) comes back as `Verdict.read`, in the verdict's (last) read."""
        tree = draft.parents
        at = None
        if self.history is not None:
            self._catch_up()  # tokens accepted since the last step
            assert not isinstance(tree, DeviceTree)  # (`propose` read it)
            at = self.history.draft(0, draft.tokens, tree)
        if self.cfg.greedy:
            logits = self.pipeline.process(logits, at)  # the processors that can move the argmax
            if tree is None:
                return greedy_reading(draft.tokens, logits, also)
            return tree_greedy_reading(draft.tokens, tree, logits, also)
        p = self.pipeline.distributions(logits, at)  # [k + 1, V]
        if tree is None:
            return self.accept(draft.tokens, draft.probs, p, self.generator, also)
        if draft.probs is not None:  # siblings sampled without replacement
            assert isinstance(tree, list), "spec.rsd's trees have their shape on the host"
            return verify_tree_rsd(draft.tokens, tree, p, draft.probs.to(p.device), self.generator, also)
        return verify_tree_sampling(draft.tokens, tree, p, self.generator, also)
