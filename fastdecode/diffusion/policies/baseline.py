"""dlm.baseline: LLaDA's `generate` with low-confidence remasking, the reference for every `dlm.*` method.

Beside the schedule it has LLaDA's three switches of its published evaluations (ML-GSAI/LLaDA `generate`):
classifier-free guidance (`cfg_scale`: a second canvas with the prompt masked, logits = un + (s + 1)(cond - un)),
`logits_eos_inf` (EOS is never predicted) and `confidence_eos_eot_inf` (a position predicting EOS or EoT gets
confidence 0, so it is committed last).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
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
from ..policy import Step, StepsConfig, View, block_view, register_dlm
from ..rules import select_topk
from ..scores import confidence, num_transfer_tokens, random_score


@dataclass(frozen=True)
class BaselineConfig(StepsConfig):
    """LLaDA's settings: `steps` forwards over the canvas, split evenly over its blocks."""

    block_length: int | None = None  # None: one block, the whole canvas (pure diffusion); smaller: semi-AR
    remasking: Literal["low_confidence", "random"] = "low_confidence"  # what ranks masked positions
    cfg_scale: float = 0.0  # classifier-free guidance s: logits = un + (s + 1)(cond - un), un from the canvas with
    #   the prompt masked (a doubled batch per forward); 0 = off
    logits_eos_inf: bool = False  # EOS logits set to -inf: EOS is never predicted (LLaDA's HumanEval setting)
    confidence_eos_eot_inf: bool = False  # EOS and EoT left out of the confidence softmax: a position predicting
    #   either gets confidence 0 and is committed last

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.remasking in ("low_confidence", "random"), "remasking", self.remasking,
              "must be 'low_confidence' or 'random'")
        check(self.cfg_scale >= 0, "cfg_scale", self.cfg_scale, "must be >= 0 (0 turns guidance off)")
        if self.cfg_scale > 0:
            check(self.cache == "none", "cache", self.cache,
                  "must be 'none' with cfg_scale > 0 (LLaDA's guidance has no cached forward)")

    def check_block_length(self, block_length: int) -> None:
        n = self.max_new_tokens
        divisors = ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
        check(block_length >= 1 and n % block_length == 0, "block_length", block_length,
              f"must divide max_new_tokens={n}: choose one of {divisors}, or None for a single block")


class Schedule:
    """LLaDA's fixed schedule: at a block's first step its masks are split evenly over `steps` steps
    (`get_num_transfer_tokens`); step t of the block commits the top k[t] positions by score."""

    def __init__(self, mask_id: int, size: int, steps: int, rows: int, device: torch.device) -> None:
        self.mask_id, self.size, self.steps = mask_id, size, steps
        self.block = torch.full((rows,), -1, dtype=torch.long, device=device)  # block each row is in
        self.t = torch.zeros(rows, dtype=torch.long, device=device)  # steps taken in it
        self.k = torch.zeros(rows, steps, dtype=torch.long, device=device)  # its schedule

    def view(self, gen: torch.Tensor, rows: torch.Tensor) -> View:
        v = block_view(gen, self.mask_id, self.size)
        new = v.block != self.block[rows]
        if new.any():
            r, cols = rows[new], torch.arange(gen.shape[1], device=gen.device)
            inside = (cols >= v.lo[new, None]) & (cols < v.hi[new, None])
            self.block[r], self.t[r] = v.block[new], 0
            self.k[r] = num_transfer_tokens(((gen[new] == self.mask_id) & inside).sum(-1), self.steps)
        return v

    def count(self, rows: torch.Tensor) -> torch.Tensor:
        """`[B']` this step's k (at least 1), advancing the rows' step counters."""
        k = self.k[rows, self.t[rows].clamp(max=self.steps - 1)].clamp(min=1)
        self.t[rows] += 1
        return k


def end_tokens(model: MaskedDiffusionLM) -> tuple[list[int], list[int]]:
    """(EOS ids, EoT ids) as LLaDA's switches mean them: the tokenizer's end-of-turn token <|eot_id|> where it has
    one (LLaDA-8B-Instruct: 126348), and the model's other EOS ids (LLaDA: <|endoftext|>, 126081)."""
    tok = model.tokenizer
    eot = tok.convert_tokens_to_ids("<|eot_id|>") if tok is not None and "<|eot_id|>" in tok.get_vocab() else None
    eos = sorted(i for i in model.eos_token_ids if i != eot)
    return eos, [] if eot is None else [int(eot)]


class Guided:
    """The model as LLaDA's `generate` calls it: with `cfg_scale` > 0 every forward also runs the canvas with the
    prompt (the first `prompt_width` columns, padding included, and any forced tokens) masked and mixes the logits;
    with `banned` ids, their logits are -inf; `forced` {generated offset: token} are written on every canvas the
    model sees (Prophet's constraints), as if they were there from the start. Everything else is the wrapped
    model's."""

    def __init__(self, model: MaskedDiffusionLM, prompt_width: int, cfg_scale: float = 0.0, banned: Sequence[int] = (),
                 forced: dict[int, int] | None = None) -> None:
        self._model, self._P, self._s, self._banned = model, prompt_width, cfg_scale, list(banned)
        forced = forced or {}
        self._cols = torch.tensor([prompt_width + o for o in forced], dtype=torch.long, device=model.device)
        self._toks = torch.tensor(list(forced.values()), dtype=torch.long, device=model.device)

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    def _force(self, canvas: torch.Tensor) -> torch.Tensor:
        if self._cols.numel():
            inside = self._cols < canvas.shape[1]  # a canvas cut by End-of-Text Prediction may end before some
            canvas = canvas.clone()
            canvas[:, self._cols[inside]] = self._toks[inside]
        return canvas

    def forward(self, canvas: torch.Tensor, attention_mask: torch.Tensor | None = None,
                at: torch.Tensor | None = None) -> torch.Tensor:
        canvas = self._force(canvas)
        if self._s > 0:
            un = canvas.clone()
            un[:, : self._P] = self._model.mask_token_id
            if self._cols.numel():
                un[:, self._cols[self._cols < un.shape[1]]] = self._model.mask_token_id
            both = self._model.forward(
                torch.cat([canvas, un]), None if attention_mask is None else attention_mask.repeat(2, 1),
                None if at is None else at.repeat(2, 1))
            cond, uncond = both.chunk(2)
            logits = uncond + (self._s + 1) * (cond - uncond)
        else:
            logits = self._model.forward(canvas, attention_mask, at)
        return self._ban(logits)

    def forward_columns(self, canvas: torch.Tensor, *args, **kwargs):
        logits, kv = self._model.forward_columns(self._force(canvas), *args, **kwargs)
        return self._ban(logits), kv

    def _ban(self, logits: torch.Tensor) -> torch.Tensor:
        if self._banned:
            logits = logits.index_fill(-1, torch.tensor(self._banned, device=logits.device), float("-inf"))
        return logits


class LowConfidence(Schedule):
    def __init__(self, cfg: BaselineConfig, mask_id: int, rows: int, device: torch.device,
                 generator: torch.Generator | None, quiet: Sequence[int] = ()) -> None:
        super().__init__(mask_id, cfg.block_size, cfg.steps_per_block, rows, device)
        self.random, self.generator = cfg.remasking == "random", generator
        self.quiet = list(quiet)  # ids left out of the confidence softmax (confidence_eos_eot_inf)

    def commit(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        score = step.conf
        if self.random:
            score = step.score(random_score(step.conf.shape, self.generator, step.conf.device))
        elif self.quiet:  # x0 is already chosen; only its confidence changes (0 where x0 is one of them)
            logits = step.logits.index_fill(-1, torch.tensor(self.quiet, device=step.logits.device), float("-inf"))
            score = step.score(confidence(logits, step.x0))
        return select_topk(score, self.count(step.rows)), step.x0


@register_dlm("dlm.baseline", config=BaselineConfig, lossless=True)
def run(model: MaskedDiffusionLM, batch: PromptBatch, cfg: BaselineConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """LLaDA decoding: each forward commits the k most confident masked positions of the block."""
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    eos, eot = end_tokens(model) if cfg.logits_eos_inf or cfg.confidence_eos_eot_inf else ([], [])
    if (cfg.logits_eos_inf or cfg.confidence_eos_eot_inf) and not eos:
        raise ParameterError(f"logits_eos_inf / confidence_eos_eot_inf need the model's EOS id; "
                             f"{model.name!r} has none.")
    quiet = sorted(set(eos + eot)) if cfg.confidence_eos_eot_inf else []
    policy = LowConfidence(cfg, model.mask_token_id, batch.size, model.device, generator, quiet)
    net: DenoisingModel = model
    if cfg.cfg_scale > 0 or cfg.logits_eos_inf:
        net = Guided(model, batch.width, cfg.cfg_scale, eos if cfg.logits_eos_inf else [])
    return denoise(net, batch, cfg, policy, generator, "dlm.baseline", ctx.constraint)
