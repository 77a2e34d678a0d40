"""What a dlm method plugs into the driver: its config base, the view it decodes, and the step it sees.

A policy answers two questions per step, for the rows still decoding: which span of the generated
region it looks at (`view`: a semi-AR block, a sliding window, the rest of the canvas) and which masked
positions of that span to commit, with which tokens (`commit`). The driver owns the canvas, the model
and the cache; the policy only sees tensors.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar, runtime_checkable

import torch

from ..config import MethodConfig, check
from ..registry import ConstraintSupport, DriverOf, register

CacheKind = Literal["none", "prefix", "dual", "suffix", "delayed", "window"]
C = TypeVar("C", bound=MethodConfig)

# A constraint on a dlm.* method is applied by the grammar mask over the canvas; Grammar-Aligned Decoding needs a
# left-to-right distribution to reweight
MASK_ONLY = ConstraintSupport(
    sampling=("mask",),
    why="it reweights a left-to-right distribution, which a diffusion method does not sample from; use "
        "sampling='mask' with dlm.*, or GAD with ar.sample / spec.*",
)


def register_dlm(
    name: str, *, config: type[C], lossless: bool = False, constraints: ConstraintSupport = MASK_ONLY,
) -> Callable[[DriverOf[C]], DriverOf[C]]:
    """`registry.register` for the dlm.* family: a masked-diffusion method that honours a constraint by the grammar
    mask (`MASK_ONLY`) unless it declares otherwise."""
    return register(name, kind="diffusion", config=config, lossless=lossless, constraints=constraints)


@dataclass(frozen=True)
class DiffusionConfig(MethodConfig):
    """Parameters every `dlm.*` method takes. `max_new_tokens` is LLaDA's gen_length: the masks on the canvas."""

    temperature: float = 0.0  # 0: argmax; > 0: Gumbel-max sampling in float64
    seed: int | None = None  # None draws from torch's global RNG; a seed makes the run repeat
    # K/V reuse: prefix / dual (Fast-dLLM), suffix (masks after the view), delayed (dKV-Cache), window
    #   (Window-Diffusion: window.py)
    cache: CacheKind = "none"
    cache_refresh: int | None = None  # a full refresh at least every n steps; None: only at block changes (prefix,
    #   dual, suffix), every 8 steps (delayed), every 32 (window); 1: every step, exactly the uncached result
    window_tokens: int = 64  # cache="window": masks the recomputed columns attend to; those past them are pruned
    active_tokens: int = 16  # cache="window": the first masks, recomputed every step (with the view)
    recap: int | None = None  # ReCAP's refresh schedule (recap.py): a full forward, then `recap` cheap cached ones,
    #   again and again, in place of the cache's own refreshes; None: the cache's own schedule
    recap_warmup: int = 0  # with recap: the first n steps of a row are all full (ReCAP's pre_full_iters)
    eotp: bool = False  # End-of-Text Prediction (Learn2PD): once an EOS is committed, every mask after it is settled
    #   as that EOS at once and its columns are dropped from later forwards (driver.py, `Canvas.settle`)
    eotp_keep: bool = False  # with eotp: keep the settled EOS columns in the forwards (the EOS-padded canvas the
    #   zoo's models were trained on) instead of dropping them; saves steps, not the columns' compute

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0 <= self.temperature < math.inf, "temperature", self.temperature,
              "must be a finite number >= 0 (0 means argmax)")
        check(self.cache in ("none", "prefix", "dual", "suffix", "delayed", "window"), "cache", self.cache,
              "must be 'none', 'prefix', 'dual', 'suffix', 'delayed' or 'window'")
        check(self.window_tokens >= 1, "window_tokens", self.window_tokens, "must be at least 1")
        check(self.active_tokens >= 1, "active_tokens", self.active_tokens, "must be at least 1")
        if self.recap is not None:
            check(self.recap >= 1, "recap", self.recap, "must be at least 1 (cheap steps per full one), or None")
            check(self.cache != "none", "cache", self.cache,
                  "must be a cache ('dual', 'suffix', 'prefix' or 'delayed') with recap: its cheap steps are the "
                  "cache's partial forwards")
            check(self.cache_refresh is None, "cache_refresh", self.cache_refresh,
                  "must be None with recap, which sets the refreshes itself")
        check(self.recap_warmup >= 0, "recap_warmup", self.recap_warmup, "must be >= 0")
        check(self.recap is not None or self.recap_warmup == 0, "recap_warmup", self.recap_warmup,
              "only applies with recap (it makes the first steps full)")
        check(self.eotp or not self.eotp_keep, "eotp_keep", self.eotp_keep,
              "only applies with eotp=True (it keeps the columns End-of-Text Prediction settles)")
        if self.cache_refresh is not None:
            check(self.cache_refresh >= 1, "cache_refresh", self.cache_refresh,
                  "must be at least 1 (1 refreshes every step), or None for the cache's default")


@dataclass(frozen=True)
class BlockConfig(DiffusionConfig):
    """Semi-autoregressive decoding: the canvas is decoded block by block, left to right."""

    block_length: int | None = 32  # positions per block (the last may be shorter); None: the whole canvas

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.block_length is not None:
            self.check_block_length(self.block_length)

    def check_block_length(self, block_length: int) -> None:
        check(block_length >= 1, "block_length", block_length, "must be at least 1, or None for one block")

    @property
    def block_size(self) -> int:
        return min(self.block_length or self.max_new_tokens, self.max_new_tokens)

    @property
    def num_blocks(self) -> int:
        return -(-self.max_new_tokens // self.block_size)


@dataclass(frozen=True)
class StepsConfig(BlockConfig):
    """LLaDA's fixed schedule: `steps` forwards over the canvas, the same number per block."""

    steps: int | None = None  # None: one token per step (max_new_tokens steps)

    def __post_init__(self) -> None:
        super().__post_init__()
        n, blocks = self.max_new_tokens, self.num_blocks
        if self.steps is not None:
            check(1 <= self.steps <= n, "steps", self.steps,
                  f"must be between 1 and max_new_tokens={n} (one token per step at most steps)")
            check(self.steps % blocks == 0, "steps", self.steps,
                  f"must be divisible by the number of blocks, {blocks} (= max_new_tokens / block_length), "
                  f"so every block gets the same number of steps")

    @property
    def steps_per_block(self) -> int:
        return self.block_size if self.steps is None else self.steps // self.num_blocks

    @property
    def total_steps(self) -> int:
        return self.steps or self.max_new_tokens


@dataclass(frozen=True)
class View:
    """Per live row `[B']`: the span [lo, hi) of generated offsets a step looks at, and its block id.

    Caches that keep K/V outside the current block (prefix, dual, suffix) refresh when the block id changes.
    """

    lo: torch.Tensor
    hi: torch.Tensor
    block: torch.Tensor
    width: int | None = None  # max(hi - lo) when the host knows it without reading the device (`block_view`), else
    #   None; the forward's output width, which would otherwise be read back every step


@dataclass(frozen=True)
class Step:
    """One step as a policy sees it: the live rows' views, padded to the widest (`W`)."""

    index: int  # 0-based step number of the run
    rows: torch.Tensor  # [B'] batch rows still decoding
    view: View
    tokens: torch.Tensor  # [B', W] tokens of the view (the mask id where masked)
    inview: torch.Tensor  # [B', W] column inside the row's view
    masked: torch.Tensor  # [B', W] masked and in view: the positions that may be committed
    logits: torch.Tensor  # [B', W, V] float logits; MASK is never predicted (-inf)
    x0: torch.Tensor  # [B', W] prediction: argmax, or a Gumbel-max draw at temperature > 0
    conf: torch.Tensor  # [B', W] float64 p(x0), -inf off `masked`

    def score(self, values: torch.Tensor) -> torch.Tensor:
        """`values` as a rule score: float64, -inf off the masked positions of the view."""
        return values.double().masked_fill(~self.masked, float("-inf"))


class Policy(Protocol):
    def view(self, gen: torch.Tensor, rows: torch.Tensor) -> View:
        """`gen` `[B', N]` the live rows' generated regions, `rows` `[B']` their batch rows."""
        ...

    def commit(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (`[B', W]` bool positions to commit, `[B', W]` their tokens)."""
        ...


@runtime_checkable
class Growing(Protocol):
    """A policy that decides the canvas length itself (`dlm.dystruct`): the driver starts each row on `start`
    columns and, after each step's commits, lengthens it to what `grow` asks (`max_new_tokens` is only the cap).
    Its views are cut at each row's born size."""

    def start(self, cap: int) -> int:
        """The canvas length every row starts with, given the cap `max_new_tokens`."""
        ...

    def grow(self, step: Step, gen: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
        """After the step's commits (`gen` `[B', N]`, `size` `[B']` born columns) -> `[B']` the sizes wanted."""
        ...


def first_mask(gen: torch.Tensor, mask_id: int) -> torch.Tensor:
    """`[B, N]` -> `[B]` offset of the first masked position (N when none)."""
    masked = gen == mask_id
    N = gen.shape[-1]
    return torch.where(masked.any(-1), masked.long().argmax(-1), N)


def block_view(gen: torch.Tensor, mask_id: int, size: int) -> View:
    """Fixed semi-AR blocks of `size`: the first block that still holds a mask (the last may be shorter). When the
    blocks tile the region, every row with a mask has a full block, so the view's width is `size` on the host."""
    N = gen.shape[-1]
    lo = first_mask(gen, mask_id) // size * size
    return View(lo, (lo + size).clamp(max=N), lo // size, size if N % size == 0 else None)


def to_end(view: View, n: int) -> View:
    """The same view widened to the end of the generated region (look-ahead for cross-block methods)."""
    return View(view.lo, torch.full_like(view.hi, n), view.block)


def columns(step: Step) -> torch.Tensor:
    """`[B', W]` generated offsets of the view's columns (clamped into the region past its end)."""
    W, n = step.masked.shape[-1], int(step.view.hi.max())
    return (step.view.lo[:, None] + torch.arange(W, device=step.masked.device)).clamp(max=n - 1)


def in_block(step: Step, hi: torch.Tensor) -> torch.Tensor:
    """`[B', W]` the columns of a widened view that lie before offset `hi` `[B']` (the current block)."""
    W = step.masked.shape[-1]
    return torch.arange(W, device=hi.device) < (hi - step.view.lo)[:, None]


class BlockPolicy:
    """Fixed blocks of `cfg.block_size` and a pure rule of the step: the shape of most threshold-type methods."""

    def __init__(self, mask_id: int, size: int) -> None:
        self.mask_id, self.size = mask_id, size

    def view(self, gen: torch.Tensor, rows: torch.Tensor) -> View:
        return block_view(gen, self.mask_id, self.size)

    def commit(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        return self.select(step), step.x0

    def select(self, step: Step) -> torch.Tensor:  # pragma: no cover - overridden
        raise NotImplementedError
