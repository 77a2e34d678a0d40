"""The masked-diffusion driver: a canvas of masks after the prompt, decoded view by view (LLaDA `generate`).

Each step is one forward (through the cache, if any); the method's policy then picks which masked
positions of its view take their prediction x0. Every row commits at least one position per step, so a
run never stalls. Unlike LLaDA, a row stops once its text is settled through its first EOS, and the rows
left are decoded without it. With `eotp=True` (End-of-Text Prediction, Learn2PD) a committed EOS also settles
every mask after it at once, and those columns leave the forwards.

A policy that is `Growing` (policy.py; `dlm.dystruct`) starts each row on a shorter canvas and lengthens it after a
step: the columns past a row's `size` are not born yet, so no forward sees them and nothing is committed there;
`max_new_tokens` is then only the cap. Growing appends masks at the end and never touches a committed token.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from itertools import count
from typing import Any

import torch

from ..models.diffusion import DenoisingModel
from ..sampling.pipeline import LogitsPipeline, SuppressTokens
from ..types import PromptBatch, StepEvent
from .cache import Forwarder
from .policy import DiffusionConfig, Growing, Policy, Step, View
from .rules import top1
from .scores import confidence, predict


class Canvas:
    """The batch's canvases `[B, T]` = prompt (left-padded) + `max_new_tokens` masks, and the rows still decoding.

    A row's canvas is born up to `size` (all `n` columns unless a `Growing` policy started it shorter): the masks
    past it are room to grow into, hidden from every forward and never committed."""

    def __init__(self, model: DenoisingModel, batch: PromptBatch, n: int, start: int | None = None) -> None:
        self.device, self.mask_id = model.device, model.mask_token_id
        B, self.P, self.N = batch.size, batch.width, n
        self.x = torch.cat([batch.input_ids, torch.full((B, n), self.mask_id)], dim=1).to(self.device)  # [B, T]
        self.attention = torch.cat([batch.attention_mask, torch.ones(B, n, dtype=torch.long)], dim=1).to(self.device)
        self.eos = torch.tensor(sorted(model.eos_token_ids), dtype=torch.long, device=self.device)
        self.live = torch.arange(B, device=self.device)  # rows still decoding; finished rows cost no more work
        self.live_rows = list(range(B))  # the same on the host, so that no step reads it back
        self.B = B
        self.end = torch.full((B,), n, dtype=torch.long, device=self.device)  # generated offsets >= end are settled
        self.growing = start is not None
        size = n if start is None else max(1, min(start, n))
        self.size = torch.full((B,), size, dtype=torch.long, device=self.device)  # [B] born columns per row
        self.cols = torch.arange(n, device=self.device)  # [N] generated offsets, built once per generation
        self.pad = torch.full((B, n), self.mask_id, dtype=torch.long, device=self.device)  # room `write` spills into

    def grow(self, rows: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
        """Lengthen `rows`' canvases to `size` `[B']` (never shorter, at most `n`): masks appended at the end.
        -> the rows that grew."""
        new = torch.maximum(self.size[rows], size.clamp(max=self.N))
        grew = new > self.size[rows]
        self.size[rows] = new
        return rows[grew]

    def settle(self, rows: torch.Tensor) -> None:
        """End-of-Text Prediction on `rows`: every mask after the first committed EOS becomes that EOS, and the
        row's canvas ends there for later forwards (`end`)."""
        self.x[rows, self.P :], end = settle(self.x[rows, self.P :], self.mask_id, self.eos)
        self.end[rows] = torch.minimum(self.end[rows], end)

    def clip(self, view: View, rows: torch.Tensor) -> View:
        """The view cut at each row's settled end and born size (at least one column)."""
        hi = torch.minimum(torch.minimum(view.hi, self.of(self.end, rows)), self.of(self.size, rows))
        return View(view.lo, torch.maximum(hi, view.lo + 1), view.block)

    def visible(self, rows: torch.Tensor, hi: torch.Tensor, settled: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(canvases, attention) of `rows` as a forward sees them: without the unborn columns and, when `settled`
        (End-of-Text Prediction), without those after a committed EOS (`cut`)."""
        end, size = self.of(self.end, rows), self.of(self.size, rows)
        end = torch.minimum(end, size) if settled else size
        return cut(self.of(self.x, rows), self.of(self.attention, rows), self.P, torch.maximum(end, hi))

    def of(self, t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """`t[rows]` for a per-row tensor `t` `[B, ...]`; `t` itself (no copy, no operation) when `rows` are every
        row, which the host knows from their count: `rows` are always a sorted subset of the batch."""
        return t if len(rows) == self.B else t[rows]

    def gen(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """`[B', N]` generated regions of `rows` (default: the live rows). Read it before the next `write`: with
        every row live it is a view of the canvas."""
        return self.of(self.x, self.live if rows is None else rows)[:, self.P :]

    def write(self, rows: torch.Tensor, lo: torch.Tensor, commit: torch.Tensor, tokens: torch.Tensor) -> None:
        """Put `tokens` `[B', W]` where `commit` at offsets lo + j, on the device (nothing is read back: the host
        learns the commits from `read_step`). A view's columns past the region's end (never committed) land in
        padding cut off again."""
        W = commit.shape[1]
        gen = torch.cat([self.gen(rows), self.pad[: len(rows), :W]], dim=1)  # [B', N + W]
        at = lo[:, None] + self.cols[:W]  # [B', W] distinct offsets, < N + W
        gen.scatter_(1, at, torch.where(commit, tokens, gen.gather(1, at)))
        if len(rows) == self.B:
            self.x[:, self.P :] = gen[:, : self.N]
        else:
            self.x[rows, self.P :] = gen[:, : self.N]

    def keep(self, done: list[bool]) -> None:
        """Drop the live rows that are `done` (host values, from `read_step`)."""
        if any(done):
            self.live_rows = [r for r, d in zip(self.live_rows, done, strict=True) if not d]
            self.live = torch.tensor(self.live_rows, dtype=torch.long, device=self.device)


def denoise(
    model: DenoisingModel,
    batch: PromptBatch,
    cfg: DiffusionConfig,
    policy: Policy,
    generator: torch.Generator | None,
    method: str = "dlm",
    constraint: Any = None,
) -> Iterator[StepEvent]:
    """Run `policy` to the end: one forward and at least one commit per live row and step. A compiled
    `constraint` masks each row's frontier and keeps only the commits that leave the canvas completable
    (constraints/diffusion.py)."""
    growing = policy if isinstance(policy, Growing) else None
    canvas = Canvas(model, batch, cfg.max_new_tokens, None if growing is None else growing.start(cfg.max_new_tokens))
    guard = None
    if constraint is not None:
        from ..constraints.diffusion import CanvasGuard

        guard = CanvasGuard(constraint, [batch.row(b) for b in range(batch.size)], model.eos_token_ids,
                            model.mask_token_id)
    forward = Forwarder(model, cfg, canvas.B, method)
    P = canvas.P
    for index in count():
        live = canvas.live
        view = policy.view(canvas.gen(), live)
        x, attention = canvas.of(canvas.x, live), canvas.of(canvas.attention, live)
        if cfg.eotp or canvas.growing:
            view = canvas.clip(view, live)
            drop = cfg.eotp and not cfg.eotp_keep
            if drop or canvas.growing:
                x, attention = canvas.visible(live, view.hi, settled=drop)
        logits = forward(x, attention, live, view.lo + P, view.hi + P, view.block, index, view.width)
        forward.keep()
        if guard is not None:
            logits = guard.mask_frontier(logits, live, view.lo, view.hi, canvas.gen())
        step = make_step(index, live, view, canvas.gen(), logits, canvas.mask_id, cfg.temperature, generator,
                         canvas.cols)
        commit, tokens = policy.commit(step)
        commit = commit & step.masked
        commit |= top1(step.conf) & ~commit.any(-1, keepdim=True)  # a rule that committed nothing: its best
        if guard is not None:
            commit, tokens = guard.filter(step, commit, tokens, canvas.gen(), generator)
        canvas.write(live, view.lo, commit, tokens)
        if growing is not None:
            forward.grow(canvas.grow(live, growing.grow(step, canvas.gen(), canvas.of(canvas.size, live))))
        if cfg.eotp:
            canvas.settle(live)
        done = finished(canvas.gen(), canvas.mask_id, canvas.eos, canvas.of(canvas.size, live), canvas.cols)
        # the step's one read: the event streams its commits, and the host must know which rows are left
        pairs, proposed, ended = read_step(view.lo, commit, tokens, step.masked.sum(-1), done)
        yield event(index, canvas.B, canvas.live_rows, pairs, proposed, ended)
        canvas.keep(ended)
        if not canvas.live_rows:
            return


def settle(gen: torch.Tensor, mask_id: int, eos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """End-of-Text Prediction on generated regions `[R, N]`: every mask after a row's first EOS becomes that EOS
    token (the zoo's training pads answers with EOS, so the padding is what the model would write; positions
    after the first EOS are never output). -> (the settled regions, `[R]` offset one past the first EOS, or N)."""
    N = gen.shape[-1]
    is_eos = torch.isin(gen, eos)  # [R, N]
    first = torch.where(is_eos.any(-1), is_eos.long().argmax(-1), N)  # [R]
    pad = gen.gather(1, first.clamp(max=N - 1)[:, None])  # [R, 1] the EOS token itself
    after = torch.arange(N, device=gen.device) > first[:, None]  # [R, N]
    return torch.where(after & (gen == mask_id), pad, gen), (first + 1).clamp(max=N)


def cut(x: torch.Tensor, attention: torch.Tensor, P: int, end: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Canvases `[R, T]` without the columns past each row's generated offset `end` `[R]`: cut after the widest
    row's end, the rest hidden from attention (a dropped column costs no compute in a forward of one row)."""
    T = P + int(end.max())
    hidden = torch.arange(T - P, device=x.device)[None, :] >= end[:, None]  # [R, T - P]
    attention = attention[:, :T].clone()
    attention[:, P:] = attention[:, P:].masked_fill(hidden, 0)
    return x[:, :T], attention


def make_step(
    index: int, rows: torch.Tensor, view: View, gen: torch.Tensor, logits: torch.Tensor, mask_id: int,
    temperature: float, generator: torch.Generator | None, cols: torch.Tensor | None = None,
) -> Step:
    """Gather the view's tokens, predict x0 and score it.

    The logits go through the logits pipeline (`sampling/pipeline.py`; today only the MASK suppression, as no
    dlm config has a history-dependent parameter); x0 is then drawn by LLaDA's float64 Gumbel-max at
    `temperature` and its confidence read from the untempered logits, as the reference code does. `cols`:
    `arange(N)` on the device, when the caller keeps one."""
    N, W = gen.shape[1], logits.shape[1]
    j = torch.arange(W, device=gen.device) if cols is None else cols[:W]
    inview = j < (view.hi - view.lo)[:, None]  # [B', W]
    tokens = gen.gather(1, (view.lo[:, None] + j).clamp(max=N - 1)).masked_fill(~inview, mask_id)
    masked = inview & (tokens == mask_id)
    logits = never_mask(mask_id).process(logits)  # never predict MASK
    x0, conf = propose(logits, masked, temperature, generator)
    return Step(index, rows, view, tokens, inview, masked, logits, x0, conf)


@functools.lru_cache(maxsize=8)
def never_mask(mask_id: int) -> LogitsPipeline:
    """The logits pipeline of every step, built once per mask id (its processor keeps its index on the device)."""
    return LogitsPipeline([SuppressTokens([mask_id])])


def propose(
    logits: torch.Tensor, masked: torch.Tensor, temperature: float, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x0 (argmax or Gumbel-max draw) and its float64 probability, -inf off the masked positions."""
    x0 = predict(logits, temperature, generator)  # [B, W]
    return x0, confidence(logits, x0).masked_fill(~masked, float("-inf"))


def finished(gen: torch.Tensor, mask_id: int, eos: torch.Tensor, size: torch.Tensor | None = None,
             cols: torch.Tensor | None = None) -> torch.Tensor:
    """`[B, N]` generated region -> `[B]` bool: no mask remains up to the first EOS (or anywhere, if none), counting
    only the born columns (`size` `[B]`, default all): a row whose canvas did not grow ends at its size. `cols`:
    `arange(N)` on the device, when the caller keeps one.

    Positions before the first EOS never change once committed, so the output is then final.
    """
    N = gen.shape[-1]
    is_eos = torch.isin(gen, eos)  # [B, N]
    first = torch.where(is_eos.any(-1), is_eos.long().argmax(-1), N)  # [B] offset of the first EOS, or N
    if size is not None:
        first = torch.minimum(first, size)
    before = (torch.arange(N, device=gen.device) if cols is None else cols) < first[:, None]  # [B, N]
    return ~((gen == mask_id) & before).any(-1)


def read_step(
    lo: torch.Tensor,  # [B'] each view's first offset
    commit: torch.Tensor,  # [B', W] bool
    tokens: torch.Tensor,  # [B', W]
    proposed: torch.Tensor,  # [B'] masked positions the step could commit
    done: torch.Tensor,  # [B'] bool
) -> tuple[list[list[tuple[int, int]]], list[int], list[bool]]:
    """Everything the host needs of a step, in one read from the device (one synchronisation on a GPU)
    -> (per row the (offset, token) pairs committed, `proposed`, `done`)."""
    chosen = torch.where(commit, tokens, -1)  # [B', W] the token committed at each column, -1 where none
    packed = torch.cat([lo[:, None], proposed[:, None], done[:, None], chosen], dim=1)  # [B', 3 + W]
    pairs, offered, ended = [], [], []
    for row in packed.tolist():
        start, written = row[0], row[3:]
        pairs.append([(start + j, t) for j, t in enumerate(written) if t >= 0])
        offered.append(row[1])
        ended.append(bool(row[2]))
    return pairs, offered, ended


def event(
    index: int,
    B: int,
    live: list[int],  # [B'] row ids
    pairs: list[list],  # per live row: (offset, token) committed
    proposed: list[int],  # [B'] masked positions the step could commit
    done: list[bool],  # [B']
    forwards: int = 1,
) -> StepEvent:
    """The step's `StepEvent`, from host values only."""
    tokens: list[tuple[tuple[int, int], ...]] = [()] * B
    offered, accepted, fin = [0] * B, [0] * B, [True] * B  # rows not live finished earlier
    for i, row in enumerate(live):
        tokens[row] = tuple(sorted(pairs[i]))
        offered[row], accepted[row], fin[row] = proposed[i], len(pairs[i]), done[i]
    return StepEvent(index, tuple(tokens), forwards=forwards, proposed=tuple(offered), accepted=tuple(accepted),
                     finished=tuple(fin))
