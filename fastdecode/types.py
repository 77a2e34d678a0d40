"""Small frozen types shared by every method family."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Union

import numpy as np
import torch

from .stats import Stats

ModelKind = Literal["causal", "diffusion"]


@dataclass(frozen=True)
class PromptBatch:
    """Prompts tokenised and left-padded to one length.

    `input_ids` and `attention_mask` are `[B, L]`; `lengths[b]` is the true length of row b, whose
    tokens sit in the last `lengths[b]` columns.
    """

    input_ids: torch.Tensor  # [B, L] long
    attention_mask: torch.Tensor  # [B, L] long, 0 on left padding
    lengths: tuple[int, ...]

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def width(self) -> int:
        return self.input_ids.shape[1]

    def row(self, b: int) -> list[int]:
        """Row b's prompt tokens without padding."""
        return self.input_ids[b, self.width - self.lengths[b] :].tolist()


@dataclass(frozen=True)
class StepEvent:
    """What one step of a driver did, per batch row.

    `tokens[b]` holds `(offset, token_id)` pairs committed in row b this step, where offset counts from
    the end of the prompt (0 = first generated token). AR and speculative drivers commit consecutive
    offsets; diffusion drivers commit any masked offsets. A later event may overwrite an offset.
    """

    index: int  # 0-based step number
    tokens: tuple[tuple[tuple[int, int], ...], ...]
    forwards: int = 1  # target forwards spent by this step
    draft_forwards: int = 0
    proposed: tuple[int, ...] = ()  # per row: drafted tokens (spec) or masked positions offered (dlm)
    accepted: tuple[int, ...] = ()  # per row: accepted draft tokens (spec) or committed positions (dlm)
    finished: tuple[bool, ...] = ()  # per row: the row is done after this step
    draft_s: tuple[float, ...] = ()  # per row: seconds spent drafting (speculative drivers)
    verify_s: tuple[float, ...] = ()  # per row: seconds in the target's verification forward and the accept rule


@dataclass(frozen=True)
class Result:
    """One prompt's output: generated token ids (through the first EOS), decoded text and stats."""

    token_ids: list[int]
    text: str
    stats: Stats
    method: str
    prompt_ids: list[int] = field(default_factory=list)
    trace: list[StepEvent] | None = None
    # with constraint=: False when max_new_tokens cut the output before it was a whole sentence of the grammar
    # (a valid prefix, not a valid output); None without a constraint
    constraint_complete: bool | None = None
    # an image model's picture, uint8 [H, W] decoded from token_ids (models/image.py); None for text models
    image: np.ndarray | None = None


@dataclass(frozen=True)
class Finished:
    """The last event of a stream: the results, one per prompt, in input order."""

    results: list[Result]


Event = Union[StepEvent, Finished]
