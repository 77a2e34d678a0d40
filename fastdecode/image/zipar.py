"""img.zipar: ZipAR (He et al. 2024, arXiv 2412.04062), next-set decoding of an image's rows.

Raster order makes row r + 1 wait for the whole of row r, though an image's tokens depend mostly on their spatial
neighbours. ZipAR starts row r + 1 once row r has `window` tokens and then advances every active row by one token
per forward, so a forward samples up to h tokens. On an h x w grid with window s (s <= w) the rows finish after
(h - 1) * s + w forwards, the prefill included: 25 instead of 49 on a 7 x 7 grid at s = 3. With s >= w it is
raster order, ar.sample's tokens draw for draw (the same seeded generator, the same distributions).

Each forward feeds, at their raster positions (1-D RoPE), the tokens the cache has not seen; every token sees the
prompt and every generated token before it in raster order (a 4-D mask over the stored columns), never one after
it. The first token of a row whose row above is unfinished is predicted from the position of that row's last token,
which does not exist yet: as the authors' code does, a stand-in (the row above's latest token) is fed there, seen
by nobody else and dropped from the cache after the forward, and the real token takes its place when it comes.
Training-free and lossy: the rows after the first see less of the row above than the teacher was trained on.
The authors' `LlamaGen-ZipAR/autoregressive/models/generate_zipar.py` (`decode_n_tokens_zipar`) attends over a
static cache with the raster-causal mask, so a token there also sees the zero keys of raster positions not yet
generated; here those positions are masked instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..config import check
from ..errors import IncompatibleMethodError, ParameterError, PromptError
from ..models.causal import CausalLM
from ..registry import RunContext, register
from ..sampling.config import SamplingConfig
from ..sampling.pipeline import LogitsPipeline
from ..sampling.samplers import make_generator
from ..types import PromptBatch, StepEvent


@dataclass(frozen=True)
class ZipARConfig(SamplingConfig):
    window: int = 3  # s: row r + 1 starts once row r has s tokens (>= the grid width: raster order, ar.sample)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.window >= 1, "window", self.window, "must be at least 1")


def zipar_forwards(h: int, w: int, window: int) -> int:
    """Forwards (the prefill included) that ZipAR spends on an h x w grid: (h - 1) * min(window, w) + w."""
    return (h - 1) * min(window, w) + w


@dataclass
class _Plan:
    """One forward: the tokens fed (the unseen generated ones, then stand-ins) and which input predicts each row."""

    feed: list[int]  # raster indices of generated tokens the cache has not seen, ascending
    stand_ins: list[tuple[int, int]]  # (raster index of the missing token, raster index of the token copied there)
    queries: list[tuple[int, int]]  # (row, input slot in feed + stand_ins whose logits predict the row's next token)


def _schedule(made: list[int], w: int, window: int, cached: set[int]) -> _Plan:
    """The next forward after the prefill, from how many tokens each row has (`made`)."""
    h = len(made)
    feed = sorted(r * w + c for r in range(h) for c in range(made[r]) if r * w + c not in cached)
    stand_ins: list[tuple[int, int]] = []
    queries: list[tuple[int, int]] = []
    for r in range(h):
        if made[r] >= w or (r > 0 and made[r - 1] < min(window, w)):
            continue  # finished, or not started: the row above is not far enough
        before = r * w + made[r] - 1  # the token whose logits predict this row's next one
        if before in feed:
            queries.append((r, feed.index(before)))
            continue
        assert made[r] == 0 and made[r - 1] < w, "a generated predictor is always fed the step after it is drawn"
        stand_ins.append((before, (r - 1) * w + made[r - 1] - 1))
        queries.append((r, len(feed) + len(stand_ins) - 1))
    return _Plan(feed, stand_ins, queries)


def _mask(cached_pos: list[int], new_pos: list[int], n_real: int) -> torch.Tensor:
    """`[1, 1, T, C + T]` bool: a new token sees stored and fed tokens at earlier raster positions (and itself);
    stand-ins (the last T - n_real) are seen by nobody but themselves."""
    q = torch.tensor(new_pos)  # [T]
    past = torch.tensor(cached_pos)[None, :] < q[:, None]  # [T, C]
    new = q[None, :] <= q[:, None]  # [T, T]
    new[:, n_real:] = False
    new |= torch.eye(len(new_pos), dtype=torch.bool)
    return torch.cat([past, new], dim=1)[None, None]


def _check(model: CausalLM, batch: PromptBatch, cfg: ZipARConfig) -> LogitsPipeline:
    """Refuse what the schedule cannot serve, before the first step; returns the request's pipeline."""
    if model.image is None:
        raise IncompatibleMethodError(f"img.zipar decodes an image's rows; {model.name!r} is a text model.")
    pipeline = LogitsPipeline.from_config(cfg)
    if pipeline.uses_history or pipeline.stateful:
        raise ParameterError("img.zipar samples several rows per forward without a token history: leave "
                             "repetition_penalty at 1 (it has no meaning for image codes).")
    if len({len(batch.row(b)) for b in range(batch.size)}) != 1:
        raise PromptError("img.zipar runs every row on one schedule: give prompts of one length (one class token).")
    return pipeline


def _steps(model: CausalLM, batch: PromptBatch, cfg: ZipARConfig, ctx: RunContext,
           pipeline: LogitsPipeline) -> Iterator[StepEvent]:
    """The rows' step events; every row of the batch follows the same schedule (it depends only on the grid)."""
    image = model.image
    assert image is not None  # _check refused a text model
    prompts = [batch.row(b) for b in range(batch.size)]
    P = len(prompts[0])
    h, w, B = image.h, image.w, batch.size
    generator = make_generator(cfg.seed, ctx.generator, model.device)
    device = model.device
    cache = model.new_cache(batch=B, capacity=P + h * w + h)
    codes = torch.zeros(B, h * w, dtype=torch.long)  # [B, h*w]
    # the prefill: the prompt, whose last token predicts code 0
    ids = torch.tensor(prompts, dtype=torch.long)  # [B, P]
    logits = model.forward(ids.to(device), torch.arange(P, device=device)[None].expand(B, P), cache, num_logits=1)
    first = pipeline.pick(logits[:, -1], None, generator).cpu()  # [B]
    codes[:, 0] = first
    made = [1] + [0] * (h - 1)
    cached_pos = list(range(P))  # logical positions of the stored columns
    cached: set[int] = set()
    yield _event(0, [[(0, int(t))] for t in first], made, w)
    step = 1
    while any(m < w for m in made):
        plan = _schedule(made, w, cfg.window, cached)
        fed = [codes[:, i] for i in plan.feed] + [codes[:, src] for _, src in plan.stand_ins]
        new_pos = [P + i for i in plan.feed] + [P + i for i, _ in plan.stand_ins]
        T = len(new_pos)
        mask = _mask(cached_pos, new_pos, len(plan.feed)).to(device)
        inp = torch.stack(fed, dim=1).to(device)  # [B, T]
        pos = torch.tensor(new_pos, device=device)[None].expand(B, T)
        logits = model.forward(inp, pos, cache, mask)  # [B, T, V]
        kept = [n - len(plan.stand_ins) for n in cache.lengths]
        cache.crop_rows(kept)  # the stand-ins leave the cache; the real tokens come later
        cached.update(plan.feed)
        cached_pos += [P + i for i in plan.feed]
        picked: list[list[tuple[int, int]]] = [[] for _ in range(B)]
        for r, slot in plan.queries:  # rows top to bottom, one draw per batch row each
            token = pipeline.pick(logits[:, slot], None, generator).cpu()  # [B]
            i = r * w + made[r]
            codes[:, i] = token
            made[r] += 1
            for b in range(B):
                picked[b].append((i, int(token[b])))
        yield _event(step, picked, made, w)
        step += 1


def _event(index: int, picked: list[list[tuple[int, int]]], made: list[int], w: int) -> StepEvent:
    done = all(m >= w for m in made)
    rows = len(picked)
    return StepEvent(index=index, tokens=tuple(tuple(p) for p in picked), forwards=1,
                     proposed=tuple(0 for _ in range(rows)), accepted=tuple(0 for _ in range(rows)),
                     finished=tuple(done for _ in range(rows)))


@register("img.zipar", kind="causal", config=ZipARConfig, images_only=True)
def run(model: CausalLM, batch: PromptBatch, cfg: ZipARConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """ZipAR: row r+1 starts once row r has `window` tokens, one token per active row per forward; lossy."""
    return _steps(model, batch, cfg, ctx, _check(model, batch, cfg))
