"""hf.assisted: transformers' assisted generation (speculative decoding), `generate(assistant_model=draft)`.

transformers changes its behaviour with the environment: where scikit-learn can be imported, its candidate generator
re-chooses `assistant_confidence_threshold` during a generation from the drafts' fate (an ROC curve, scikit-learn's
`roc_curve`); without it the threshold stays fixed. The same settings then draft differently on two machines, so
`adaptive_threshold` names the behaviour and results rows record it: None (the default) is transformers' own choice,
resolved when the configuration is built; False keeps the threshold fixed even where scikit-learn is installed (the
candidate generator is told, in this thread for the run, that it is not); True needs scikit-learn.
`spec.draft_model`'s `confidence_stop` and `adaptive_stop` draft as these two do.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from ..config import MethodConfig, check
from ..models.causal import CausalLM
from ..registry import RunContext, register
from ..types import PromptBatch, StepEvent
from .driver import check_assisted, check_sliding_assistant, hf_driver


@dataclass(frozen=True)
class AssistedConfig(MethodConfig):
    """transformers' defaults; they are set on the assistant's generation config for the run only."""

    num_assistant_tokens: int = 20
    num_assistant_tokens_schedule: Literal["constant", "heuristic", "heuristic_transient"] = "constant"
    assistant_confidence_threshold: float = 0.4  # drafting stops early below this confidence; 0 = off
    # whether transformers re-chooses the threshold during a generation (module docstring); None: as transformers
    # does here (where scikit-learn is installed), resolved when the configuration is built
    adaptive_threshold: bool | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.num_assistant_tokens >= 1, "num_assistant_tokens", self.num_assistant_tokens, "must be at least 1")
        check(0 <= self.assistant_confidence_threshold < 1, "assistant_confidence_threshold",
              self.assistant_confidence_threshold, "must be in [0, 1)")
        adapts = _transformers_adapts()
        check(not self.adaptive_threshold or self.assistant_confidence_threshold > 0, "adaptive_threshold",
              self.adaptive_threshold, "adapts assistant_confidence_threshold, so it needs one to start from: add "
              "assistant_confidence_threshold=0.4 (transformers' default)")
        check(not self.adaptive_threshold or adapts, "adaptive_threshold", self.adaptive_threshold,
              "needs scikit-learn, which transformers computes the threshold with: pip install scikit-learn, or "
              "leave adaptive_threshold unset (or false) for a fixed threshold")
        if self.adaptive_threshold is None:  # frozen: the resolved value is what the run does, and what rows record
            object.__setattr__(self, "adaptive_threshold", adapts and self.assistant_confidence_threshold > 0)


@register("hf.assisted", kind="causal", config=AssistedConfig, lossless=True, needs_draft=True)
def run(model: CausalLM, batch: PromptBatch, cfg: AssistedConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """transformers assisted generation with a draft model (needs draft=), greedy (reference)."""
    check_assisted(model, "hf.assisted", "target")
    check_assisted(ctx.draft, "hf.assisted", "draft model")
    check_sliding_assistant(ctx.draft, "hf.assisted")
    return _run(model, batch, cfg, ctx.draft, ctx.constraint)


def _run(model: CausalLM, batch: PromptBatch, cfg: AssistedConfig, draft: CausalLM,
         constraint: Any = None) -> Iterator[StepEvent]:
    settings = {
        "num_assistant_tokens": cfg.num_assistant_tokens,
        "num_assistant_tokens_schedule": cfg.num_assistant_tokens_schedule,
        "assistant_confidence_threshold": cfg.assistant_confidence_threshold,
    }
    return hf_driver(model, batch, {"max_new_tokens": cfg.max_new_tokens}, assistant=draft.model,
                     constraint=constraint, around=lambda: _assisting(draft.model.generation_config, settings,
                                                                       fixed=not cfg.adaptive_threshold))


@contextlib.contextmanager
def _assisting(gen: Any, settings: dict[str, Any], fixed: bool) -> Iterator[None]:
    """The settings on the draft's generation config for one prompt's generate(), and its own values back after it:
    under the "heuristic" schedule transformers writes the draft length it reached back into that config, where the
    next prompt of a batch would start from it; each row starts as a run of its own does."""
    saved = {k: getattr(gen, k, None) for k in settings}
    for k, v in settings.items():
        setattr(gen, k, v)
    try:
        with fixed_threshold() if fixed else contextlib.nullcontext():
            yield
    finally:
        for k, old in saved.items():
            setattr(gen, k, old)


_CANDIDATES = "transformers.generation.candidate_generator"
_fixed = threading.local()  # .on: this thread's assisted runs keep their threshold


def _transformers_adapts() -> bool:
    """Whether transformers' candidate generator adapts its threshold here (it asks `is_sklearn_available`)."""
    probe = getattr(importlib.import_module(_CANDIDATES), "is_sklearn_available", None)
    return probe is not None and bool(getattr(probe, "fastdecode_original", probe)())


def _unless_fixed(original: Callable[[], bool]) -> Callable[[], bool]:
    def is_sklearn_available() -> bool:
        return not getattr(_fixed, "on", False) and original()

    is_sklearn_available.fastdecode_original = original  # type: ignore[attr-defined]
    return is_sklearn_available


@contextlib.contextmanager
def fixed_threshold() -> Iterator[None]:
    """transformers' candidate generator keeps its threshold meanwhile, in this thread: its module's
    `is_sklearn_available`, which it asks before adapting, is wrapped once to answer False while a run here is on
    (other threads, and this one afterwards, get the real answer)."""
    module = importlib.import_module(_CANDIDATES)
    probe = getattr(module, "is_sklearn_available", None)
    if probe is not None and not hasattr(probe, "fastdecode_original"):
        module.is_sklearn_available = _unless_fixed(probe)  # type: ignore[attr-defined]
    before = getattr(_fixed, "on", False)
    _fixed.on = True
    try:
        yield
    finally:
        _fixed.on = before
