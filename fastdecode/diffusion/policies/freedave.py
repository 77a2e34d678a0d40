"""dlm.freedave: FreeDave draft-and-verify, lossless with respect to `dlm.baseline` at one token per step
(cychomatica/FreeDave `generation/core.py`, the `exact_match` rule).

From a state s and its logits, the baseline's next K states are guessed at once: draft d_i commits the i
most confident masks of s's block (d_1 = the baseline's next state, certain). All drafts run through one
batched forward, whose logits give each draft's own next state. d_(i+1) is accepted while it equals the
next state of d_i, so the accepted chain is exactly the baseline's trajectory, and the last accepted
draft's logits seed the next round: one forward advances 1 to K baseline steps.

A run starts with one forward of the all-mask canvas (its first step costs 2 forwards). At temperature > 0
every state keeps the one Gumbel draw it was verified with, so the output follows the baseline's
distribution exactly (not its random stream). Prefix, dual and suffix caches stay lossless: a draft that needs a
refresh (new block, periodic refresh) ends the chain. The delayed cache is refused: its K/V depend on the
order of past steps, which parallel drafts cannot reproduce.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ...config import check
from ...models.diffusion import MaskedDiffusionLM
from ...registry import ConstraintSupport, RunContext
from ...sampling.samplers import make_generator
from ...types import PromptBatch, StepEvent
from ..cache import Forwarder
from ..driver import Canvas, cut, event, finished, make_step, settle
from ..policy import BlockConfig, View, block_view, register_dlm
from ..rules import top1


@dataclass(frozen=True)
class FreeDaveConfig(BlockConfig):
    """As `dlm.baseline` with steps = max_new_tokens; the output equals it token for token at temperature 0."""

    block_length: int | None = None  # as dlm.baseline: None is one block, the whole canvas
    draft_steps: int = 4  # K: baseline steps guessed per forward (FreeDave's eval setting)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.draft_steps >= 1, "draft_steps", self.draft_steps, "must be at least 1")
        check(self.recap is None, "recap", self.recap,
              "cannot be set for dlm.freedave: a ReCAP warm-up ends inside a round of drafts verified against one "
              "cache; use cache_refresh=n for a periodic refresh")
        check(self.cache != "delayed", "cache", self.cache,
              "cannot be 'delayed' for dlm.freedave: a delayed cache depends on the order of past steps, which "
              "drafts verified in parallel cannot reproduce; use 'prefix', 'dual' or 'suffix'")


@dataclass
class State:
    """A row's state with its logits' prediction: x0 and p(x0) over its view (from offset lo), and the baseline's
    next commit from it (host values, read with the other states of its forward)."""

    lo: int
    x0: torch.Tensor  # [W]
    conf: torch.Tensor  # [W] float64, -inf off the view's masks
    next: tuple[int, int]  # (offset, token): its most confident mask (lowest offset on ties) and x0 there


@dataclass
class Plan:
    """A row's drafts for one round, d_1..d_K in commit order (cut after the first that finishes the row); all
    but the drafts are host values, read in one go."""

    drafts: torch.Tensor  # [K, N] generated regions
    offsets: list[int]  # [K] the position each draft adds
    tokens: list[int]  # [K] and its token
    done: list[bool]  # [K] the draft is decoded through its first EOS: it needs no forward (only the last can be)
    offered: int  # masks of the state's view

    @property
    def pending(self) -> int:
        """The drafts that need a forward: all but a last one that is done."""
        return len(self.done) - self.done[-1]


class FreeDave:
    def __init__(self, model: MaskedDiffusionLM, batch: PromptBatch, cfg: FreeDaveConfig,
                 generator: torch.Generator | None) -> None:
        self.canvas = Canvas(model, batch, cfg.max_new_tokens)
        self.forward = Forwarder(model, cfg, self.canvas.B, "dlm.freedave")
        self.cfg, self.generator, self.mask_id = cfg, generator, model.mask_token_id
        self.every = self.forward.every if cfg.cache != "none" else 0

    def evaluate(self, gens: torch.Tensor, rows: torch.Tensor, index: int) -> list[State]:
        """One batched forward of the generated regions `gens` `[R, N]` (entries of `rows`) -> their states."""
        c = self.canvas
        view = block_view(gens, self.mask_id, self.cfg.block_size)
        x, attention = torch.cat([c.x[rows, : c.P], gens], dim=1), c.attention[rows]
        steps = (gens != self.mask_id).sum(-1)  # the baseline step whose forward sees this canvas
        if self.cfg.eotp:  # the drafts are settled (`plan`): their columns after the first EOS are dropped
            end = settle(gens, self.mask_id, c.eos)[1]
            view = View(view.lo, torch.maximum(torch.minimum(view.hi, end), view.lo + 1), view.block)
            if not self.cfg.eotp_keep:
                x, attention = cut(x, attention, c.P, torch.maximum(end, view.hi))
        logits = self.forward(x, attention, rows, view.lo + c.P, view.hi + c.P, view.block, steps, view.width)
        s = make_step(index, rows, view, gens, logits, self.mask_id, self.cfg.temperature, self.generator, c.cols)
        best = top1(s.conf).long().argmax(-1)  # [R] each state's next baseline commit (a row without masks: 0)
        host = torch.stack([view.lo, best, s.x0.gather(1, best[:, None])[:, 0]], dim=1).tolist()  # the one read
        return [State(lo, s.x0[i], s.conf[i], (lo + j, token)) for i, (lo, j, token) in enumerate(host)]

    def plan(self, row: int, state: State) -> Plan:
        """Draft i commits the i most confident masks of the state's view: the baseline's next i steps, if
        the ranking held."""
        gen, masked = self.canvas.x[row, self.canvas.P :], state.conf > float("-inf")
        # drafts for up to K of the view's columns, most confident first (ties: lowest offset); those past its
        # masks (ranked after them) are cut below, once the mask count is read with the rest
        K = min(self.cfg.draft_steps, len(state.conf))
        if self.every > 1:  # a periodic refresh may only fall on the last draft (at 1 every forward is full)
            done = int((gen != self.mask_id).sum())
            K = min(K, max(1, self.every - (done - int(self.forward.ref_step[row]))))
        order = state.conf.argsort(descending=True, stable=True)[:K]
        offsets, tokens = state.lo + order, state.x0[order]  # [K] distinct offsets (some may lie past N)
        at = offsets[:, None] == self.canvas.cols  # [K, N] the column commit k writes
        holds = at.long().cumsum(0) > 0  # [K, N] draft i holds commits 0..i
        drafts = torch.where(holds, (at * tokens[:, None]).sum(0), gen)  # [K, N]
        if self.cfg.eotp:  # each draft is the baseline's state after its commits, settled as the baseline's is
            drafts = settle(drafts, self.mask_id, self.canvas.eos)[0]
        ends = finished(drafts, self.mask_id, self.canvas.eos, cols=self.canvas.cols)
        host = torch.cat([offsets, tokens, ends.long(), masked.sum()[None]]).tolist()  # the plan's one read
        offered = host[-1]
        K = min(K, offered)  # a draft per mask at most
        ended = [bool(e) for e in host[2 * len(order) : 2 * len(order) + K]]
        K = ended.index(True) + 1 if True in ended else K  # drafts past the row's end are never needed
        return Plan(drafts[:K], host[:K], host[len(order) : len(order) + K], ended[:K], offered)

    def run(self) -> Iterator[StepEvent]:
        c, index = self.canvas, 0
        states = dict(zip(c.live_rows, self.evaluate(c.gen(), c.live, index), strict=True))  # the priming forward
        self.forward.keep()
        spent = {r: 1 for r in states}  # forwards each row used this round
        while c.live_rows:
            live = c.live_rows
            plans = {r: self.plan(r, states[r]) for r in live}
            entries = [(r, i) for r in live for i in range(plans[r].pending)]
            evaluated: dict[tuple[int, int], State] = {}
            if entries:  # every draft of every row in one batched forward
                rows = torch.tensor([r for r, _ in entries], device=c.device)
                gens = torch.cat([plans[r].drafts[: plans[r].pending] for r in live])  # in the order of entries
                evaluated = dict(zip(entries, self.evaluate(gens, rows, index), strict=True))
            kept, pairs, finish = [], [], []
            for r in live:
                p, j = plans[r], accepted(r, plans[r], evaluated)
                c.x[r, c.P :] = p.drafts[j]
                pairs.append(list(zip(p.offsets[: j + 1], p.tokens[: j + 1], strict=True)))
                finish.append(p.done[j])
                if not finish[-1]:
                    states[r] = evaluated[(r, j)]
                    kept.append(entries.index((r, j)))
                spent[r] += int(p.pending > 0)
            if kept and self.cfg.cache != "none":
                self.forward.keep(torch.tensor(kept, device=c.device))
            yield from self._events(index, pairs, finish, spent, [plans[r].offered for r in live])
            c.keep(finish)
            spent = {r: 0 for r in c.live_rows}
            index += 1

    def _events(self, index: int, pairs: list, finish: list[bool], spent: dict[int, int],
                offered: list[int]) -> Iterator[StepEvent]:
        """One event per distinct forward count of this round, fewest first: the rows that spent fewer
        forwards all finish in theirs, so every row is charged exactly what it spent."""
        c, live = self.canvas, self.canvas.live_rows
        charged = 0
        for f in sorted(set(spent.values())):
            now = [spent[r] == f for r in live]
            before = [spent[r] < f for r in live]  # finished in an earlier event of this round
            sub = [pairs[i] if now[i] else [] for i in range(len(live))]
            fin = [(finish[i] and now[i]) or before[i] for i in range(len(live))]
            masks = [offered[i] if now[i] else 0 for i in range(len(live))]
            yield event(index, c.B, live, sub, masks, fin, forwards=f - charged)
            charged = f


def accepted(row: int, plan: Plan, evaluated: dict[tuple[int, int], State]) -> int:
    """Index j of the last accepted draft: d_1 always; d_(i+1) while it is d_i's own next baseline state."""
    j = 0
    while j + 1 < len(plan.drafts) and (row, j) in evaluated:
        if evaluated[(row, j)].next != (plan.offsets[j + 1], plan.tokens[j + 1]):
            break
        j += 1
    return j


# its draft-and-verify loop over the canvas has no commit step the grammar mask could reach
NO_CONSTRAINT = ConstraintSupport(refused="runs a draft-and-verify loop of its own over the canvas; "
                                          "use dlm.threshold or another dlm.* method")


@register_dlm("dlm.freedave", config=FreeDaveConfig, lossless=True, constraints=NO_CONSTRAINT)
def run(model: MaskedDiffusionLM, batch: PromptBatch, cfg: FreeDaveConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """FreeDave: draft the next K baseline steps, verify them in one batched forward; equals dlm.baseline."""
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    return FreeDave(model, batch, cfg, generator).run()
