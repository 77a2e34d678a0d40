"""dlm.dystruct: flexible-length decoding as structural inference (Dystruct, arXiv 2605.09820; no public code).

The canvas is not fitted to the task: each row starts on a window of `window` masks and the method decides the
length (`max_new_tokens` is only the cap; the driver grows the canvas, `policy.Growing`). Every step views the
whole undecoded window and infers from its one forward (structure.py):

1. the length: the posterior that the answer's first EOS falls inside the window; below `gamma` the window grows
   by `expand` masks (half of it when the posterior is undecided), and while it is too short nothing is committed
   in its last `expand // 2` columns, whose place in the answer is not settled yet;
2. the blocks: a CRP partition of the window by entropy affinity and predicted delimiters;
3. the schedule: the block with the most stable, best anchored masks (the mode of the Gibbs distribution over
   -beta * H + lam * C) is decoded now, by the threshold rule (Fast-dLLM's tau) inside it.

A committed EOS fixes the length: the window stops growing, and with `eotp` (on by default here) the masks after it
are settled at once. The paper's edge welding (remasking tokens at closed block boundaries) is not done: the driver
never remasks a committed token (docs/diffusion.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ...config import check
from ...models.diffusion import MaskedDiffusionLM
from ...registry import RunContext
from ...sampling.samplers import make_generator
from ...types import PromptBatch, StepEvent
from .. import structure as st
from ..driver import denoise
from ..policy import DiffusionConfig, Step, View, first_mask, register_dlm
from ..rules import threshold
from .adablock import delimiter_ids


@dataclass(frozen=True)
class DystructConfig(DiffusionConfig):
    """`max_new_tokens` is the cap on the answer's length, not the canvas: the method grows the canvas to fit."""

    max_new_tokens: int = 256
    eotp: bool = True  # a committed EOS settles every mask after it (the length is decided)
    threshold: float = 0.9  # commit rule inside the scheduled block (at least its best mask)
    window: int = 32  # masks every row starts with (the shortest canvas the zoo's dlm-small was trained on)
    expand: int = 16  # masks a growth appends (half of it when the length posterior is undecided)
    gamma: float = 0.5  # the window is kept once P(first EOS inside it, `margin` before its end) >= gamma
    margin: int = 1  # columns the first EOS must leave before the window's end
    alpha: float = 0.5  # CRP concentration: the weight of opening a new block (a column joins a block of n
    #   while n * affinity > alpha)
    sigma: float = 0.5  # entropy affinity scale (nats): a column far from its block's mean entropy leaves it
    max_block: int = 16  # the longest block
    beta: float = 1.0  # schedule: weight of a block's instability (mean entropy, nats)
    lam: float = 1.0  # schedule: weight of its anchoring (the sides touching decoded text, weighted as below)
    right_anchor: float = 0.5  # weight of a block's right side against its left (prompt) side: dlm-small decodes
    #   worse from the end of an answer back (a sudoku filled bottom-up broke its first row), so the prompt side leads
    delimiters: str = "\\n"  # characters whose predicted tokens end a block (backslash escapes allowed; AdaBlock's
    #   default; a comma would end a block after every item of the zoo's lists, two tokens)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0 <= self.threshold <= 1, "threshold", self.threshold, "must be in [0, 1]")
        check(self.window >= 1, "window", self.window, "must be at least 1 (a cap below it is the whole canvas)")
        check(self.expand >= 1, "expand", self.expand, "must be at least 1")
        check(0 < self.gamma < 1, "gamma", self.gamma, "must be in (0, 1)")
        check(self.margin >= 0, "margin", self.margin, "must be >= 0")
        check(self.alpha > 0, "alpha", self.alpha, "must be > 0")
        check(self.sigma > 0, "sigma", self.sigma, "must be > 0")
        check(self.max_block >= 1, "max_block", self.max_block, "must be at least 1")
        check(self.beta >= 0 and self.lam >= 0, "beta/lam", (self.beta, self.lam), "must be >= 0")
        check(self.right_anchor >= 0, "right_anchor", self.right_anchor, "must be >= 0 (0: only the left side)")


class Dystruct:
    def __init__(self, model: MaskedDiffusionLM, cfg: DystructConfig) -> None:
        self.mask_id, self.cfg = model.mask_token_id, cfg
        self.eos = torch.tensor(sorted(model.eos_token_ids), dtype=torch.long, device=model.device)
        self.delims = delimiter_ids(model, cfg.delimiters)

    def start(self, cap: int) -> int:
        return self.cfg.window

    def view(self, gen: torch.Tensor, rows: torch.Tensor) -> View:
        """The whole undecoded window: from the first mask to the row's born size (the driver cuts it there)."""
        lo = first_mask(gen, self.mask_id)
        return View(lo, torch.full_like(lo, gen.shape[1]), lo // self.cfg.max_block)

    def _end(self, step: Step) -> torch.Tensor:
        """`[B', W]` the posterior of where the answer's first EOS is."""
        p = st.eos_mass(step.logits, self.eos)
        decided = torch.isin(step.tokens, self.eos).double()
        return st.end_posterior(torch.where(step.masked, p, decided), step.inview)

    def _fit(self, step: Step, end: torch.Tensor | None = None) -> torch.Tensor:
        """`[B']` P(the answer ends inside the window)."""
        end = self._end(step) if end is None else end
        return st.fits(end, step.view.hi - step.view.lo, self.cfg.margin)

    def commit(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.cfg
        end = self._end(step)
        fit = self._fit(step, end) >= c.gamma
        ended = torch.isin(step.tokens, self.eos).any(-1)  # the window holds a committed EOS
        known = fit | ended
        h = st.entropy(step.logits).masked_fill(~step.masked, 0.0)
        delim = torch.isin(step.x0, self.delims) & step.masked
        boundary = torch.where(delim, step.conf, torch.isin(step.tokens, self.delims).double())
        # the answer's end is a boundary too: a block starts where the first EOS is likely to be
        boundary = torch.maximum(boundary, torch.cat([end[:, 1:], torch.zeros_like(end[:, :1])], dim=-1))
        ids = st.partition(h, boundary.clamp(0, 1), step.inview, c.alpha, c.sigma, c.max_block)
        chosen = st.schedule(ids, h, step.masked, step.inview, known, c.beta, c.lam, c.right_anchor)
        # a window still too short: its last columns may belong further on in the answer, so they wait
        width = (step.view.hi - step.view.lo)[:, None]
        cols = torch.arange(step.masked.shape[1], device=width.device)
        settled = known[:, None] | (cols[None, :] < width - max(1, c.expand // 2))
        allowed = chosen & settled
        allowed = torch.where(allowed.any(-1, keepdim=True), allowed, chosen)
        return threshold(step.conf.masked_fill(~allowed, float("-inf")), c.threshold), step.x0

    def grow(self, step: Step, gen: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
        """Append masks where the length posterior says the answer runs past the window, or where the window has
        no mask left and no EOS; never after a committed EOS."""
        c = self.cfg
        cols = torch.arange(gen.shape[1], device=gen.device)
        born = cols[None, :] < size[:, None]
        ended = (torch.isin(gen, self.eos) & born).any(-1)
        full = ~((gen == self.mask_id) & born).any(-1)
        more = st.expansion(self._fit(step), c.expand, c.gamma)
        more = torch.where(full, more.clamp(min=max(1, c.expand // 2)), more)
        return torch.where(ended, size, size + more)


@register_dlm("dlm.dystruct", config=DystructConfig)
def run(model: MaskedDiffusionLM, batch: PromptBatch, cfg: DystructConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Dystruct: the canvas grows until the length posterior says the answer fits; CRP blocks by entropy and
    delimiters, decoded most stable and best anchored first (threshold inside); max_new_tokens is only a cap."""
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    return denoise(model, batch, cfg, Dystruct(model, cfg), generator, "dlm.dystruct", ctx.constraint)
