"""dlm.adablock: AdaBlock-dLLM, semi-AR blocks whose ends follow the text's structure (lgxi24/AdaBlock-dLLM).

At a block's first step the model's predictions over a look-ahead window (25% of max_new_tokens) are
searched for delimiter tokens; if the most confident one reaches `delimiter_threshold`, the block ends
there (inclusive), else it has the default length. Inside a block: the Fast-dLLM threshold rule.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ...config import check
from ...models.diffusion import MaskedDiffusionLM
from ...registry import RunContext
from ...sampling.samplers import make_generator
from ...types import PromptBatch, StepEvent
from ..driver import denoise
from ..policy import BlockConfig, Step, View, first_mask, in_block, register_dlm
from ..rules import threshold


@dataclass(frozen=True)
class AdaBlockConfig(BlockConfig):
    """`block_length` is the default block, used when no delimiter is confident enough."""

    threshold: float = 0.9  # in-block commit threshold (Fast-dLLM rule)
    delimiter_threshold: float = 0.3  # AdaBlock's LLaDA setting (0.5 for Dream)
    delimiters: str = "\n"  # characters whose tokens may end a block (AdaBlock: newline; comma, period also listed)
    window_fraction: float = 0.25  # look-ahead window, as a fraction of max_new_tokens

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0 <= self.threshold <= 1, "threshold", self.threshold, "must be in [0, 1]")
        check(0 <= self.delimiter_threshold <= 1, "delimiter_threshold", self.delimiter_threshold, "must be in [0, 1]")
        check(0 < self.window_fraction <= 1, "window_fraction", self.window_fraction, "must be in (0, 1]")


_DELIMITERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {chars: ids}


def delimiter_ids(model: MaskedDiffusionLM, chars: str) -> torch.Tensor:
    """Token ids whose text contains one of `chars` (backslash escapes such as \\n allowed); none without a
    tokenizer. Remembered per tokenizer: decoding the whole vocabulary costs more than a short generation."""
    if "\\" in chars:
        chars = chars.encode().decode("unicode_escape")
    tok = model.tokenizer
    if tok is None or not chars:
        return torch.zeros(0, dtype=torch.long, device=model.device)
    known = _DELIMITERS.setdefault(tok, {})
    if chars not in known:
        known[chars] = [i for i in range(len(tok)) if any(ch in tok.decode([i]) for ch in chars)]
    return torch.tensor(known[chars], dtype=torch.long, device=model.device)


class AdaBlock:
    def __init__(self, model: MaskedDiffusionLM, cfg: AdaBlockConfig, rows: int) -> None:
        self.mask_id, self.cfg, self.n = model.mask_token_id, cfg, cfg.max_new_tokens
        self.delims = delimiter_ids(model, cfg.delimiters)
        self.window = max(1, int(cfg.window_fraction * self.n))
        device = model.device
        self.hi = torch.zeros(rows, dtype=torch.long, device=device)  # end of each row's block (0: none yet)
        self.count = torch.full((rows,), -1, dtype=torch.long, device=device)  # blocks started
        self.deciding = torch.zeros(rows, dtype=torch.bool, device=device)

    def view(self, gen: torch.Tensor, rows: torch.Tensor) -> View:
        lo = first_mask(gen, self.mask_id)
        new = lo >= self.hi[rows]  # the block is decoded: the next starts at the first mask
        self.deciding[rows] = new
        self.count[rows] += new.long()
        reach = max(self.window, self.cfg.block_size)  # the look-ahead must also hold a default block
        hi = torch.where(new, (lo + reach).clamp(max=self.n), self.hi[rows])
        return View(lo, hi, self.count[rows])

    def commit(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        rows = step.rows
        new = self.deciding[rows]
        if new.any():
            self.hi[rows[new]] = self._block_end(step)[new]
        blocked = step.conf.masked_fill(~in_block(step, self.hi[rows]), float("-inf"))
        return threshold(blocked, self.cfg.threshold), step.x0

    def _block_end(self, step: Step) -> torch.Tensor:
        """`[B']` offset one past the most confident delimiter of the window, if confident enough, else the default."""
        lo, W = step.view.lo, step.x0.shape[1]
        j = torch.arange(W, device=lo.device)
        near = (j < self.window) & step.masked  # [B', W]
        delim = near & torch.isin(step.x0, self.delims)
        p = step.conf.masked_fill(~delim, float("-inf"))
        best, at = p.max(dim=-1)
        default = (lo + self.cfg.block_size).clamp(max=self.n)
        return torch.where(best >= self.cfg.delimiter_threshold, lo + at + 1, default)


@register_dlm("dlm.adablock", config=AdaBlockConfig)
def run(model: MaskedDiffusionLM, batch: PromptBatch, cfg: AdaBlockConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """AdaBlock: each block ends at a confident delimiter of a look-ahead window (else block_length); threshold
    inside."""
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    return denoise(model, batch, cfg, AdaBlock(model, cfg, batch.size), generator, "dlm.adablock", ctx.constraint)
