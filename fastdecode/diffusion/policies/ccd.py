"""dlm.ccd: Coherent Contextual Decoding (tonyckc/CCD-DLM-code `_sample_inference_lookahead`).

Positions are ranked by negative entropy. Each step keeps the top-v set (v grows by one per step up to
`top_v`) with its predictions; a position is "consistent" when it is in the current top set and was in
the top sets of the previous `history - 1` steps predicting the same token (cross-step agreement, an
approximation of marginalising over the contexts the earlier steps saw). If at least the scheduled k
positions are consistent they are committed instead of the plain top-k: all of them in seek mode
(CCD-DS, an adaptive budget), else the k best. Defaults follow the LLaDA port's history 2 / top_v 4.
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
from ..policy import Step, StepsConfig, columns, register_dlm
from ..rules import consistent, select_topk
from ..scores import neg_entropy
from .baseline import Schedule


@dataclass(frozen=True)
class CCDConfig(StepsConfig):
    top_v: int = 4  # largest verification set
    history: int = 2  # steps (this one included) whose top sets must agree
    seek: bool = True  # CCD-DS: commit every consistent position; False keeps the schedule's k

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.top_v >= 1, "top_v", self.top_v, "must be at least 1")
        check(self.history >= 2, "history", self.history, "must be at least 2 (this step and an earlier one)")


class Coherent(Schedule):
    def __init__(self, mask_id: int, cfg: CCDConfig, rows: int, device: torch.device) -> None:
        super().__init__(mask_id, cfg.block_size, cfg.steps_per_block, rows, device)
        self.cfg = cfg
        # tokens each of the last history-1 steps' top sets predicted, -1 outside them: [B, N] each
        self.past = [torch.full((rows, cfg.max_new_tokens), -1, dtype=torch.long, device=device)
                     for _ in range(cfg.history - 1)]

    def commit(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        rows, cols = step.rows[:, None], columns(step)
        v = (self.t[step.rows] + 1).clamp(max=self.cfg.top_v)  # the set grows within a block
        k = self.count(step.rows)
        score = step.score(neg_entropy(step.logits))
        history = [p[rows, cols].masked_fill(~step.inview, -1) for p in self.past]
        top, ok = consistent(score, step.x0, history, v)
        enough = ok.sum(-1) >= k
        chosen = ok if self.cfg.seek else select_topk(score.masked_fill(~ok, float("-inf")), k)
        newest = self.past.pop(0)  # the oldest remembered step drops out; its buffer takes this one
        newest[step.rows] = -1
        newest[rows, cols] = torch.where(step.inview & top, step.x0, -1)
        self.past.append(newest)
        return torch.where(enough[:, None], chosen, select_topk(score, k)), step.x0


@register_dlm("dlm.ccd", config=CCDConfig)
def run(model: MaskedDiffusionLM, batch: PromptBatch, cfg: CCDConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Coherent contextual decoding: commit positions whose top-entropy-rank prediction agrees across recent steps."""
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    policy = Coherent(model.mask_token_id, cfg, batch.size, model.device)
    return denoise(model, batch, cfg, policy, generator, "dlm.ccd", ctx.constraint)
