"""dlm.entropy_bound: the EB-Sampler ("entropy bounded unmasking", Ben-Hamu et al., 2025), as SGLang's `EBSampling`."""

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
from ..policy import BlockConfig, BlockPolicy, Step, register_dlm
from ..rules import entropy_bound
from ..scores import neg_entropy


@dataclass(frozen=True)
class EntropyBoundConfig(BlockConfig):
    gamma: float = 0.15  # entropy budget (nats) of the positions ranked before the last one committed

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.gamma >= 0, "gamma", self.gamma, "must be >= 0 (0 commits only zero-entropy runs)")


class EntropyBound(BlockPolicy):
    def __init__(self, mask_id: int, cfg: EntropyBoundConfig) -> None:
        super().__init__(mask_id, cfg.block_size)
        self.gamma = cfg.gamma

    def select(self, step: Step) -> torch.Tensor:
        return entropy_bound(step.score(neg_entropy(step.logits)), self.gamma)


@register_dlm("dlm.entropy_bound", config=EntropyBoundConfig)
def run(model: MaskedDiffusionLM, batch: PromptBatch, cfg: EntropyBoundConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """EB-Sampler: commit the lowest-entropy masked positions while the entropy before the last stays <= gamma."""
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    return denoise(model, batch, cfg, EntropyBound(model.mask_token_id, cfg), generator, "dlm.entropy_bound",
                   ctx.constraint)
