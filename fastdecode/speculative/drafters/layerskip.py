"""spec.layerskip: self-speculation with skipped layers, after SWIFT (Xia et al. 2025, "SWIFT: On-the-Fly
Self-Speculative Decoding for LLM Inference Acceleration"; hemingkx/SWIFT).

The target with a set S of its decoder layers left out drafts for itself; the full target verifies. S is
searched while generating (SWIFT's optimisation phase): once `context_window` tokens are generated, every
step scores one candidate set by the fraction of those tokens the skipped model reproduces (argmax, one
parallel forward) and keeps the best, until `search_steps` sets were scored or one reaches `target_score`.
Candidates are random sets and, every other time, the best set with one layer swapped (a cheap stand-in for
SWIFT's Bayesian step). Whole layers are skipped (SWIFT skips attention and MLP sub-layers separately).

Skipping swaps the model's layer list for the kept layers inside the drafter's forwards only and always
restores it. Layer 0 is never skipped, so the drafter's KV cache (whose length is read from layer 0) stays
valid: skipped layers simply get no entries. A cache belongs to one skip set; a newly adopted set brings the
cache its scoring forward filled.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import combinations

import torch
from torch import nn

from ...config import check
from ...errors import IncompatibleMethodError, ParameterError
from ...models.causal import CausalLM
from ...models.hidden import LAYER_PATHS
from ...models.hidden import decoder_layers as find_layers  # the place table, shared
from ...registry import RunContext
from ...types import PromptBatch, StepEvent
from ..drafter import Draft, SpecConfig, register_spec
from ..driver import check_rollback, speculative
from ..model_chain import ModelChainDrafter


def parse_layers(text: str) -> tuple[int, ...]:
    """Parse "2,3,5" into (2, 3, 5); the empty string is no fixed set."""
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not all(s.isdigit() for s in items):
        raise ParameterError(
            f"Parameter skip_layers={text!r} is invalid: write layer indices separated by commas, e.g. '2,3,5'."
        )
    layers = tuple(int(s) for s in items)
    check(0 not in layers, "skip_layers", text,
          "contains layer 0, which is never skipped (its KV cache tracks the length)")
    check(len(set(layers)) == len(layers), "skip_layers", text, "names a layer twice")
    return layers


@dataclass(frozen=True)
class LayerSkipConfig(SpecConfig):
    skip_ratio: float = 0.45  # share of the searchable layers skipped (all but the first and last; SWIFT's 0.45)
    skip_layers: str = ""  # a fixed skip set, e.g. "2,3,5" (0-based, never 0); turns the search off
    max_draft_tokens: int = 25  # SWIFT's max_step_draft
    confidence_stop: float = 0.8  # end the draft after a token whose draft max-probability is below this; 0 = off
    search_steps: int = 32  # skip sets scored, one per step, the first being the evenly spread start; 0 = no search
    context_window: int = 32  # the first generated tokens every candidate is scored on (SWIFT: 32)
    target_score: float = 0.95  # stop searching once a set reproduces this share of the window (SWIFT's max_score)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0 < self.skip_ratio <= 1, "skip_ratio", self.skip_ratio, "must be in (0, 1]")
        parse_layers(self.skip_layers)
        check(self.max_draft_tokens >= 1, "max_draft_tokens", self.max_draft_tokens, "must be at least 1")
        check(0 <= self.confidence_stop < 1, "confidence_stop", self.confidence_stop, "must be in [0, 1) (0 = off)")
        check(self.search_steps >= 0, "search_steps", self.search_steps, "must be >= 0 (0 = keep the starting set)")
        check(self.context_window >= 1, "context_window", self.context_window, "must be at least 1")
        check(0 < self.target_score <= 1, "target_score", self.target_score, "must be in (0, 1]")


def decoder_layers(model: nn.Module) -> tuple[nn.Module, str]:
    """The module holding the decoder layers and the attribute name of its `nn.ModuleList` (`models/hidden.py`)."""
    found = find_layers(model)
    if found is None:
        raise IncompatibleMethodError(
            f"spec.layerskip skips decoder layers, but {type(model).__name__} keeps them in none of the known places "
            f"({', '.join(LAYER_PATHS)}). Use spec.draft_model with a small draft model instead."
        )
    return found


def check_layers(model: CausalLM) -> int:
    """Refuse a model whose layers cannot be skipped safely; return the number of layers."""
    owner, name = decoder_layers(model.model)
    layers = getattr(owner, name)
    if len(layers) < 2:
        raise IncompatibleMethodError(
            f"spec.layerskip needs at least 2 decoder layers (layer 0 always runs), "
            f"but {model.name!r} has {len(layers)}."
        )
    for i, layer in enumerate(layers):
        # attention must pick its cache slot by its own layer_idx, not by its place in the (shortened) list
        idx = {m.layer_idx for m in layer.modules() if isinstance(getattr(m, "layer_idx", None), int)}
        if idx != {i}:
            raise IncompatibleMethodError(
                f"spec.layerskip cannot skip layers of {model.name!r}: decoder layer {i} does not carry its own "
                "layer_idx, so a shortened layer list would write to the wrong KV-cache slots."
            )
    return len(layers)


@contextmanager
def skipping(model: CausalLM, skip: frozenset[int]) -> Iterator[None]:
    """Run `model` without the layers in `skip`; the full layer list is back afterwards, also on errors."""
    owner, name = decoder_layers(model.model)
    full = getattr(owner, name)
    setattr(owner, name, nn.ModuleList(layer for i, layer in enumerate(full) if i not in skip))
    try:
        yield
    finally:
        setattr(owner, name, full)


class SkipSearch:
    """SWIFT's optimisation phase over sets of `n` layers out of `candidates`, with its own seeded RNG."""

    def __init__(self, candidates: list[int], n: int, budget: int, target: float) -> None:
        self.candidates, self.n, self.budget, self.target = candidates, n, budget, target
        self.rng = random.Random(0)
        self.tried: set[frozenset[int]] = set()
        self.best: frozenset[int] = frozenset(candidates[int((i + 0.5) * len(candidates) / n)] for i in range(n))
        self.best_score = -1.0
        self.space = math.comb(len(candidates), n)

    @property
    def active(self) -> bool:
        return len(self.tried) < min(self.budget, self.space) and self.best_score < self.target

    def next(self) -> frozenset[int]:
        """The evenly spread start first; then alternately a random set and a neighbour of the best."""
        if not self.tried:
            return self.best
        for _ in range(64):
            if len(self.tried) % 2 and self.n < len(self.candidates):
                out = self.rng.choice(sorted(self.best))
                into = self.rng.choice(sorted(set(self.candidates) - self.best))
                s = (self.best - {out}) | {into}
            else:
                s = frozenset(self.rng.sample(self.candidates, self.n))
            if s not in self.tried:
                return s
        return next(s for c in combinations(self.candidates, self.n) if (s := frozenset(c)) not in self.tried)

    def record(self, s: frozenset[int], score: float) -> bool:
        """Note the score of `s`; True when it beats the best so far (and becomes the best)."""
        self.tried.add(s)
        if score > self.best_score:
            self.best, self.best_score = s, score
            return True
        return False


class LayerSkipDrafter(ModelChainDrafter):
    """Drafts with the target minus a skip set, keeping its own KV cache for that set in step with the context."""

    cfg: LayerSkipConfig

    def __init__(
        self, model: CausalLM, num_layers: int, cfg: LayerSkipConfig, generator: torch.Generator | None
    ) -> None:
        super().__init__(model, cfg, generator, cfg.confidence_stop)
        fixed = parse_layers(cfg.skip_layers)
        if fixed:
            self.search = None
            self.skip = frozenset(fixed)
        else:
            # SWIFT keeps the first and last layer; a 2-layer model can only lose its last
            candidates = list(range(1, num_layers - 1)) or [1]
            n = min(len(candidates), max(1, int(cfg.skip_ratio * len(candidates) + 0.5)))
            self.search = SkipSearch(candidates, n, cfg.search_steps, cfg.target_score)
            self.skip = self.search.best
        self._prompt_len: int | None = None

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        n = context.numel()
        if self._prompt_len is None:
            self._prompt_len = n
        if self.search is not None and self.search.active and n - self._prompt_len >= self.cfg.context_window:
            self._search_step(context)
        with skipping(self.model, self.skip):
            return self.draft_chain(context, min(k, self.cfg.max_draft_tokens))

    def _search_step(self, context: torch.Tensor) -> None:
        """Score one candidate set on the first `context_window` generated tokens; adopt it if it is the best."""
        assert self.search is not None and self._prompt_len is not None  # called while a search runs, after a propose
        s, W, P = self.search.next(), self.cfg.context_window, self._prompt_len
        end = P + W - 1  # positions P-1 .. P+W-2 predict the generated tokens 0 .. W-1
        cache = self.model.new_cache()
        ids = context[:end][None].to(self.model.device)
        with skipping(self.model, s):
            positions = torch.arange(end, device=ids.device)[None]
            logits = self.model.forward(ids, positions, cache, num_logits=W)[0]  # [W, V]
        self.forwards += 1
        score = float((logits.argmax(-1).cpu() == context[P : P + W]).float().mean())
        if self.search.record(s, score):
            self.skip, self.cache = s, cache


@register_spec("spec.layerskip", config=LayerSkipConfig)
def run(model: CausalLM, batch: PromptBatch, cfg: LayerSkipConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """Self-speculation (SWIFT): the target with some layers skipped drafts; the skip set is searched on the fly."""
    check_rollback(model)  # first, so that a state-space model hears why it cannot run, not where its layers are
    num_layers = check_layers(model)
    bad = [i for i in parse_layers(cfg.skip_layers) if i >= num_layers]
    if bad:
        raise ParameterError(
            f"Parameter skip_layers={cfg.skip_layers!r} is invalid: {model.name!r} has layers 0..{num_layers - 1}, "
            f"so {', '.join(map(str, bad))} cannot be skipped."
        )
    return speculative(model, batch, cfg, ctx, lambda generator: LayerSkipDrafter(model, num_layers, cfg, generator))
