"""dlm.dcd: Deferred Commitment Decoding, a sliding window over the masks instead of fixed blocks
(shuyingte/DCD `window_bidirectional_decode`, window_type="sliding").

The window starts at the first mask and holds about `window` masks: after each step its left edge moves
to the first mask and its right edge grows by the number of masks decoded, capped at `max_window` from
the left edge and at the first decoded EOS. Inside it: the threshold rule. Uncertain tokens are not
forced out at a block's end; their commitment is deferred until the window has context on both sides.
For the caches, a "block" is every `window` commits (DCD refreshes after that many decoded tokens).
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
from ..driver import denoise
from ..policy import DiffusionConfig, Step, View, first_mask, register_dlm
from ..rules import threshold


@dataclass(frozen=True)
class DCDConfig(DiffusionConfig):
    threshold: float = 0.9  # commit rule inside the window (at least one token)
    window: int = 16  # masks the window holds (DCD's initial_window_length for LLaDA / Dream)
    max_window: int = 128  # longest window

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0 <= self.threshold <= 1, "threshold", self.threshold, "must be in [0, 1]")
        check(self.window >= 1, "window", self.window, "must be at least 1")
        check(self.max_window >= self.window, "max_window", self.max_window, f"must be >= window={self.window}")


class SlidingWindow:
    def __init__(self, mask_id: int, eos: frozenset[int], cfg: DCDConfig, rows: int, device: torch.device) -> None:
        self.mask_id, self.cfg, self.n = mask_id, cfg, cfg.max_new_tokens
        self.eos = torch.tensor(sorted(eos), dtype=torch.long, device=device)
        self.right = torch.full((rows,), min(cfg.window, self.n), dtype=torch.long, device=device)

    def view(self, gen: torch.Tensor, rows: torch.Tensor) -> View:
        c, N = self.cfg, gen.shape[1]
        left, right = first_mask(gen, self.mask_id), self.right[rows]
        cols = torch.arange(N, device=gen.device)
        masks = ((gen == self.mask_id) & (cols >= left[:, None]) & (cols < right[:, None])).sum(-1)
        is_eos = torch.isin(gen, self.eos)
        eos_at = torch.where(is_eos.any(-1), is_eos.long().argmax(-1), N)
        right = torch.minimum(torch.minimum(right + c.window - masks, left + c.max_window), eos_at).clamp(max=N)
        right = torch.maximum(right, left + 1)
        self.right[rows] = right
        decoded = (gen != self.mask_id).sum(-1)
        return View(left, right, decoded // c.window)

    def commit(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        return threshold(step.conf, self.cfg.threshold), step.x0


@register_dlm("dlm.dcd", config=DCDConfig)
def run(model: MaskedDiffusionLM, batch: PromptBatch, cfg: DCDConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Deferred commitment: a sliding window holding ~16 masks replaces fixed blocks; threshold rule inside."""
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    policy = SlidingWindow(model.mask_token_id, model.eos_token_ids, cfg, batch.size, model.device)
    return denoise(model, batch, cfg, policy, generator, "dlm.dcd", ctx.constraint)
