"""One driver for every `hf.*` method: call transformers' `generate()` once per prompt, watch it with hooks.

transformers runs its own loop, so the driver reads the steps back from forward hooks: every target
forward is one verification step whose input ends with the drafted tokens (none for plain greedy), and
whose logits say how many of them greedy verification kept. Forwards made inside the assistant's own
`generate()` count as draft forwards, even when the assistant is the target module itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers
from transformers.utils import logging as hf_logging

from ..errors import IncompatibleMethodError
from ..models.capabilities import sliding_windows, state_layer_types
from ..models.causal import CausalLM
from ..types import PromptBatch, StepEvent


@dataclass
class Step:
    """One target forward: drafted tokens verified and how many of them matched the target's argmax."""

    proposed: int
    accepted: int
    draft_forwards: int


@dataclass
class Run:
    """One prompt's `generate()`: the tokens transformers returned and the steps the hooks saw."""

    tokens: list[int] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)

    def split(self) -> list[list[int]]:
        """The returned tokens cut into the steps that produced them (accepted drafts + one target token)."""
        chunks, start = [], 0
        for step in self.steps:
            chunks.append(self.tokens[start : start + step.accepted + 1])
            start += step.accepted + 1
        if start < len(self.tokens) and chunks:  # never drop a token, even if a step was misread
            chunks[-1].extend(self.tokens[start:])
        return chunks


class _Watcher:
    """Forward hooks on the target (and assistant) module; removed, and the assistant restored, on exit."""

    def __init__(self, target: torch.nn.Module, assistant: torch.nn.Module | None, prompt_len: int) -> None:
        self.target = target
        # a transformers model (or None), typed Any: its `generate` is replaced on the instance while drafting
        self.assistant: Any = assistant
        self.run = Run()
        self._prompt_len = prompt_len
        self._drafting = 0  # > 0 while the assistant's generate() runs
        self._draft_forwards = 0  # since the last target forward
        self._handles: list[Any] = []

    def _on_forward(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if self._drafting:
            self._draft_forwards += 1
            return
        ids = kwargs.get("input_ids", args[0] if args else None)  # [1, T]
        assert ids is not None  # transformers' generate passes the ids to every forward
        T = int(ids.shape[1])
        drafted = T - self._prompt_len if not self.run.steps else T - 1  # the first forward also holds the prompt
        candidates = ids[0, T - drafted :]  # [c]
        predicted = output.logits[0, -(drafted + 1) :].argmax(-1)  # [c + 1]: what the target picks at each position
        agree = (candidates == predicted[:drafted]).long().cumprod(0).sum()
        self.run.steps.append(Step(drafted, int(agree), self._draft_forwards))
        self._draft_forwards = 0

    def __enter__(self) -> _Watcher:
        modules = {id(m): m for m in (self.target, self.assistant) if m is not None}
        self._handles = [m.register_forward_hook(self._on_forward, with_kwargs=True) for m in modules.values()]
        if self.assistant is not None:
            inner = self.assistant.generate  # transformers calls `assistant_model.generate(...)` for each draft

            def drafting(*args: Any, **kwargs: Any) -> Any:
                self._drafting += 1
                try:
                    return inner(*args, **kwargs)
                finally:
                    self._drafting -= 1

            self.assistant.generate = drafting  # an instance attribute, deleted on exit
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        if self.assistant is not None:
            del self.assistant.generate


def check_assisted(model: CausalLM, method: str, role: str = "model") -> None:
    """Refuse, before the first step, a model on which transformers' assisted generation (candidate tokens verified,
    then the cache cropped back) cannot run: recurrent state-space layers have no earlier state to crop back to,
    and transformers raises "assisted generation is not supported with stateful models" only once generate() runs."""
    states = state_layer_types(model)
    if states or getattr(model.model, "_is_stateful", False):
        layers = f"recurrent state-space layers ({', '.join(states)})" if states else "a recurrent state"
        raise IncompatibleMethodError(
            f"{method} runs transformers' assisted generation, which crops the cache back after each verification, "
            f"but the {role} {model.name!r} ({type(model.model).__name__}) has {layers} that cannot be cropped "
            "(transformers: assisted generation is not supported with stateful models). Use hf.greedy or ar.greedy "
            "with this model."
        )


# transformers before 5.18: the sliding-window cache layers of an assistant, which record their past for the rollback,
# handed attention every recorded key while the mask covered the window only, so the assistant's second drafted token
# failed inside transformers ("The size of tensor a (13) must match the size of tensor b (6)"); 5.18 slices the keys
SLIDING_ASSISTANT_FIXED = (5, 18)


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as "5.17.0" or "5.18.0.dev0"."""
    parts = re.findall(r"\d+", version)
    return (int(parts[0]), int(parts[1])) if len(parts) >= 2 else (0, 0)


def check_sliding_assistant(draft: CausalLM, method: str, version: str = transformers.__version__) -> None:
    """Refuse, before the first step, a draft model with sliding-window layers as transformers' assistant where
    the installed transformers cannot run one (`SLIDING_ASSISTANT_FIXED`)."""
    windows = sliding_windows(draft)
    if windows and release(version) < SLIDING_ASSISTANT_FIXED:
        fixed = ".".join(map(str, SLIDING_ASSISTANT_FIXED))
        raise IncompatibleMethodError(
            f"{method} drafts with {draft.name!r}, whose sliding-window attention layers (window "
            f"{min(windows.values())}) transformers {version} cannot run as an assistant: its assisted generation "
            f"fails after the first drafted token (fixed in transformers {fixed}). Upgrade: pip install -U "
            f"'transformers>={fixed}', or use spec.draft_model, fastdecode's own loop, with this draft."
        )


class _GrammarLogits:
    """A transformers logits processor over fastdecode's grammar mask: transformers calls it at every position it
    scores, the verified draft positions of assisted generation and prompt lookup included."""

    def __init__(self, constraint: Any, prompt: list[int]) -> None:
        self.mask = constraint.processor()
        self.start = self.mask.begin(prompt)
        self.prompt_len = len(prompt)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        rows = []
        for ids in input_ids[:, self.prompt_len :].tolist():
            allowed = self.mask.mask(self.mask.advance_all(self.start, ids))
            rows.append(allowed if allowed is not None and bool(allowed.any()) else torch.ones_like(scores[0]).bool())
        allowed = torch.stack(rows).to(scores.device)[:, : scores.shape[-1]]
        self.mask.compiled.calls += 1
        return scores.masked_fill(~allowed, float("-inf"))


def generate_one(
    model: CausalLM, prompt: list[int], gen_kwargs: dict[str, Any], assistant: torch.nn.Module | None,
    constraint: Any = None,
) -> Run:
    """Greedy `model.model.generate()` on one unpadded prompt (a compiled `constraint` as a logits processor)."""
    if constraint is not None:
        from transformers import LogitsProcessorList

        gen_kwargs = {**gen_kwargs, "logits_processor": LogitsProcessorList([_GrammarLogits(constraint, prompt)])}
    ids = torch.tensor([prompt], dtype=torch.long, device=model.device)  # [1, L]
    target: Any = model.model  # a transformers model with generate() (torch types module attributes as Tensor | Module)
    generate = type(target).generate.__get__(target)  # the class's method, never the drafting wrapper
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the library never prints; transformers warns about generation flags
    try:
        with _Watcher(target, assistant, len(prompt)) as watcher, torch.inference_mode():
            out = generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                eos_token_id=sorted(model.eos_token_ids),
                pad_token_id=model.pad_token_id,
                assistant_model=assistant,
                **gen_kwargs,
            )
    finally:
        hf_logging.set_verbosity(verbosity)
    watcher.run.tokens = out[0, len(prompt) :].tolist()
    return watcher.run


def hf_driver(
    model: CausalLM, batch: PromptBatch, gen_kwargs: dict[str, Any], assistant: torch.nn.Module | None = None,
    constraint: Any = None, around: Callable[[], AbstractContextManager[Any]] | None = None,
) -> Iterator[StepEvent]:
    """Generate each prompt on its own (inside `around()`, a context a method sets transformers up in for one call),
    then replay the steps of all rows in lockstep, one event per step: every generate() runs before the first step
    is yielded."""
    runs = []
    for b in range(batch.size):
        with around() if around is not None else nullcontext():
            runs.append(generate_one(model, batch.row(b), gen_kwargs, assistant, constraint))
    yield from replay(runs)


def replay(runs: list[Run]) -> Iterator[StepEvent]:
    """The steps of runs made one prompt at a time (by another runtime's own loop), as events of all rows in lockstep.

    In a batch, an event's draft forwards are the most any row spent at that step, as a batched drafter
    would; everything else is per row and exact.
    """
    chunks = [run.split() for run in runs]
    size = len(runs)
    offsets = [0] * size
    for index in range(max(len(c) for c in chunks)):
        live = [b for b in range(size) if index < len(chunks[b])]
        tokens: list[tuple[tuple[int, int], ...]] = [()] * size
        for b in live:
            tokens[b] = tuple(enumerate(chunks[b][index], start=offsets[b]))
            offsets[b] += len(chunks[b][index])
        steps = [runs[b].steps[index] if b in live else None for b in range(size)]
        yield StepEvent(
            index=index,
            tokens=tuple(tokens),
            forwards=1,
            draft_forwards=max(s.draft_forwards for s in steps if s is not None),
            proposed=tuple(s.proposed if s else 0 for s in steps),
            accepted=tuple(s.accepted if s else 0 for s in steps),
            finished=tuple(index >= len(c) - 1 for c in chunks),
        )
