"""dlm.prophet: LLaDA decoding with Prophet's early commit (pixeli99/Prophet `generate_earlyexit`).

Prophet watches the top-1 minus top-2 logit gap; once the answer is settled it "goes all-in" and fills
every remaining mask with its current prediction in one step. The authors average the gap over an answer
window of `answer_length` (5) positions at `answer_start`, which their evaluation pins with forced tokens
("200:The|201:answer|202:is", the window starting two positions after the last of them), and count the
progress that picks the threshold from 1 (step t of T is t / T). Text without an answer slot has no such
window; `gap_over="masks"` (fastdecode's variant, the default when no window is given) averages the gap over
all remaining masks instead, so the commit happens once the whole rest of the canvas is that certain.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from ...config import check
from ...errors import ParameterError
from ...models.diffusion import DenoisingModel, MaskedDiffusionLM
from ...registry import RunContext
from ...sampling.samplers import make_generator
from ...types import PromptBatch, StepEvent
from ..driver import denoise
from ..policy import Step, StepsConfig, View, in_block, register_dlm, to_end
from ..rules import prophet_exit, select_topk
from ..scores import logit_gap
from .baseline import Guided, Schedule


@dataclass(frozen=True)
class ProphetConfig(StepsConfig):
    gap_early: float = 7.5  # mean top-2 logit gap that commits everything in the first third of the steps
    gap_mid: float = 5.0  # ... in the second third
    gap_late: float = 2.5  # ... afterwards
    gap_over: Literal["auto", "answer", "masks"] = "auto"  # where the gap is averaged: answer = the authors' answer
    #   window; masks = every remaining mask (fastdecode's variant); auto = answer when a window is given, else masks
    answer_start: int | None = None  # generated offset of the answer window; None: two after the last constraint
    answer_length: int = 5  # positions in the answer window (the authors' fixed 5)
    constraints: str = ""  # forced tokens, the authors' format "OFFSET:WORD|...", e.g. "200:The|201:answer|202:is":
    #   each word is encoded with a leading space and written at OFFSET (and after) before the first forward

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("gap_early", "gap_mid", "gap_late"):
            check(getattr(self, name) >= 0, name, getattr(self, name), "must be >= 0")
        check(self.gap_over in ("auto", "answer", "masks"), "gap_over", self.gap_over,
              "must be 'auto', 'answer' or 'masks'")
        check(self.answer_length >= 1, "answer_length", self.answer_length, "must be at least 1")
        if self.answer_start is not None:
            check(0 <= self.answer_start < self.max_new_tokens, "answer_start", self.answer_start,
                  f"must be a generated offset, 0 to max_new_tokens - 1 = {self.max_new_tokens - 1}")
        words = parse_constraints(self.constraints)
        for offset, _ in words:
            check(0 <= offset < self.max_new_tokens, "constraints", self.constraints,
                  f"must place words at generated offsets 0 to {self.max_new_tokens - 1}")
        if self.gap_over == "answer":
            check(self.answer_start is not None or bool(words), "gap_over", self.gap_over,
                  "needs an answer window: set answer_start or constraints")


def parse_constraints(text: str) -> list[tuple[int, str]]:
    """"200:The|201:answer" -> [(200, "The"), (201, "answer")]; a part that is not OFFSET:WORD is refused."""
    out = []
    for part in filter(None, (p.strip() for p in text.split("|"))):
        offset, _, word = part.partition(":")
        if not offset.strip().isdigit() or not word.strip():
            raise ParameterError(f"Parameter constraints={text!r} is invalid: write OFFSET:WORD parts joined by '|', "
                                 f"e.g. '200:The|201:answer|202:is'.")
        out.append((int(offset), word.strip()))
    return out


def forced_tokens(model: MaskedDiffusionLM, text: str, n: int) -> dict[int, int]:
    """{generated offset: token} of the constraints, as the authors' evaluation builds them: each word encoded
    with a leading space and no special tokens, its tokens from OFFSET on (a later word overwrites)."""
    forced: dict[int, int] = {}
    words = parse_constraints(text)
    if words and model.tokenizer is None:
        raise ParameterError(f"constraints need a tokenizer to encode their words; {model.name!r} has none.")
    for offset, word in words:
        for i, token in enumerate(model.tokenizer.encode(" " + word, add_special_tokens=False)):
            if offset + i < n:
                forced[offset + i] = int(token)
    return forced


class Prophet(Schedule):
    """LLaDA's top-k schedule in the block; the view runs to the end of the canvas so all-in can fill it (and starts
    at the answer window, where that lies before the block, so that its logits are computed)."""

    def __init__(self, mask_id: int, cfg: ProphetConfig, rows: int, device: torch.device,
                 forced: dict[int, int]) -> None:
        super().__init__(mask_id, cfg.block_size, cfg.steps_per_block, rows, device)
        self.n, self.total = cfg.max_new_tokens, cfg.total_steps
        self.levels = (cfg.gap_early, cfg.gap_mid, cfg.gap_late)
        self.hi = torch.zeros(rows, dtype=torch.long, device=device)  # end of each row's block
        self.forced_at = torch.tensor(list(forced), dtype=torch.long, device=device)
        self.forced_tok = torch.tensor(list(forced.values()), dtype=torch.long, device=device)
        start = cfg.answer_start if cfg.answer_start is not None else (max(forced) + 2 if forced else None)
        self.window: tuple[int, int] | None = None  # [lo, hi) of the answer window, when the gap is taken there
        if cfg.gap_over == "answer" or (cfg.gap_over == "auto" and start is not None):
            assert start is not None  # ProphetConfig refuses gap_over="answer" without answer_start or constraints
            self.window = (start, min(start + cfg.answer_length, self.n))

    def view(self, gen: torch.Tensor, rows: torch.Tensor) -> View:
        if self.forced_at.numel():  # forced positions are not masks: not scheduled, never the block's first mask
            gen = gen.clone()
            gen[:, self.forced_at] = self.forced_tok
        v = super().view(gen, rows)
        self.hi[rows] = v.hi
        v = to_end(v, self.n)
        first = min(([self.window[0]] if self.window else []) + self.forced_at.tolist(), default=self.n)
        if first < self.n:  # the window's logits are needed, and forced tokens are committed from the view
            v = View(v.lo.clamp(max=first), v.hi, v.block)
        return v

    def commit(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        W = step.masked.shape[-1]
        forced = torch.zeros_like(step.masked)
        tokens = step.x0
        if self.forced_at.numel():
            j = self.forced_at[None, :] - step.view.lo[:, None]  # [B', F] view column of each forced offset
            ok = (j >= 0) & (j < W)
            r = torch.arange(len(step.rows), device=j.device)[:, None].expand_as(j)
            forced[r[ok], j[ok]] = True
            forced &= step.masked
            tokens = step.x0.clone()
            tokens[r[ok], j[ok]] = self.forced_tok.expand_as(j)[ok]
        block = step.conf.masked_fill(~in_block(step, self.hi[step.rows]) | forced, float("-inf"))
        commit = select_topk(block, self.count(step.rows)) | forced
        progress = torch.full(step.rows.shape, (step.index + 1) / self.total, dtype=torch.float64,
                              device=block.device)  # the authors count steps from 1
        gap = logit_gap(step.logits)  # [B', W]
        if self.window is None:
            over = step.masked & ~forced
        else:
            cols = torch.arange(W, device=gap.device)[None, :] + step.view.lo[:, None]
            over = (cols >= self.window[0]) & (cols < self.window[1]) & step.inview
        all_in = prophet_exit(gap, over, progress, self.levels)  # [B']
        return torch.where(all_in[:, None], step.masked, commit), tokens


@register_dlm("dlm.prophet", config=ProphetConfig)
def run(model: MaskedDiffusionLM, batch: PromptBatch, cfg: ProphetConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Prophet: LLaDA top-k steps until the mean top-2 logit gap (over the answer window, or all remaining masks)
    passes 7.5/5.0/2.5 by progress, then fill all masks."""
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    forced = forced_tokens(model, cfg.constraints, cfg.max_new_tokens)
    policy = Prophet(model.mask_token_id, cfg, batch.size, model.device, forced)
    net: DenoisingModel = model
    if forced:
        net = Guided(model, batch.width, forced=forced)
    return denoise(net, batch, cfg, policy, generator, "dlm.prophet", ctx.constraint)
