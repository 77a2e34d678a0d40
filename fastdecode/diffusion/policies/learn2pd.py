"""dlm.learn2pd: Learn2PD's learned parallel decoding (Bao et al. 2025, arXiv 2509.25188; ims-kdks/Learn2PD).

A tiny filter (`heads/filter.py`, trained by `fastdecode train filter` on the model's own `dlm.baseline`
trajectories) reads the current block's confidences and their history and says which masked positions already
hold the token the run would end with; those are committed at once (sigmoid of the filter's logit >= `threshold`),
the rest are predicted again. As in the paper, End-of-Text Prediction is on by default (`eotp=True`): once an EOS is
committed every mask after it is settled and leaves the forwards. The driver commits the most confident mask when
the filter passes none, so every step commits at least one token. Lossy: the filter can be wrong.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ...config import check
from ...errors import ParameterError
from ...heads.filter import FilterHead, History
from ...heads.io import head_for
from ...models.diffusion import MaskedDiffusionLM
from ...registry import RunContext
from ...sampling.samplers import make_generator
from ...types import PromptBatch, StepEvent
from ..driver import denoise
from ..policy import BlockConfig, BlockPolicy, Step, columns, register_dlm


@dataclass(frozen=True)
class Learn2PDConfig(BlockConfig):
    block_length: int | None = 16  # the filter judges a block at a time: at most its width (16 for zoo:dlm-small)
    threshold: float = 0.95  # commit the masks whose filter probability of "final" is >= this
    head: str = ""  # the filter: a folder or zoo:<model>/<name>; "" = the one shipped beside a zoo model
    eotp: bool = True  # End-of-Text Prediction, paired with the filter as in the paper

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0 < self.threshold <= 1, "threshold", self.threshold,
              "must be in (0, 1]: the filter probability a mask needs to be committed")


class Learn2PD(BlockPolicy):
    """Fixed blocks; commit the masks the filter calls final."""

    def __init__(self, mask_id: int, cfg: Learn2PDConfig, head: FilterHead, rows: int, device: torch.device) -> None:
        super().__init__(mask_id, cfg.block_size)
        self.head, self.tau = head, cfg.threshold
        self.width = head.spec.width
        self.history = History(rows, cfg.max_new_tokens, device)

    def select(self, step: Step) -> torch.Tensor:
        feats = self.history.features(step.rows, columns(step), step.inview, step.masked, step.x0, step.conf,
                                      self.width)  # [B', width, F]
        with torch.no_grad():
            prob = torch.sigmoid(self.head(feats))[:, : step.masked.shape[1]]  # [B', W]
        return (prob >= self.tau) & step.masked


@register_dlm("dlm.learn2pd", config=Learn2PDConfig)
def run(model: MaskedDiffusionLM, batch: PromptBatch, cfg: Learn2PDConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Learn2PD: commit the masks a trained filter calls final (+ End-of-Text Prediction); lossy."""
    head = head_for(model, "learn2pd", cfg.head or None)
    assert isinstance(head, FilterHead)
    width = head.spec.width
    if cfg.block_size > width:
        raise ParameterError(f"block_length={cfg.block_length} is wider than the filter's {width} positions: pass "
                             f"block_length <= {width} (the filter judges one block at a time).")
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    policy = Learn2PD(model.mask_token_id, cfg, head.float(), batch.size, model.device)
    return denoise(model, batch, cfg, policy, generator, "dlm.learn2pd", ctx.constraint)
