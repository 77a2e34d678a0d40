"""One logits pipeline for every method: the ar picker, speculative verification and the diffusion steps.

A `LogitsPipeline` is built once per request from the method's config (`LogitsPipeline.from_config`): a list of
processors applied in order (as transformers applies them: repetition penalty, temperature, top-k, top-p,
min-p), then either argmax (temperature 0) or a softmax to sample from. Each processor is a small callable

    processor(logits [N, V], at: Positions | None) -> logits [N, V]

where `at` says what each of the N logit rows has seen (`history.Positions`: `at.seen()` is a `[N, V]` bool
mask of the prompt, the committed output and, for speculative verification, the drafted tokens before that
position). Processors that need no history ignore `at` (and accept None); those that do set `uses_history`.

Who calls what:

    pipe = LogitsPipeline.from_config(cfg)    # cfg: temperature, top_k, top_p, min_p, repetition_penalty
    hist = pipe.history(ids [R, L], vocab_size, mask=None)    # committed tokens of R sequences; hist.extend / append
    # ar picker, one logit row per sequence:
    tokens = pipe.pick(logits [R, V], hist.rows(), generator)              # [R]
    # speculative verification of one row's chain or tree draft (k nodes, k + 1 logit rows, root first):
    at = hist.draft(row, drafted [k], parents=None)             # node i's position has seen its path root -> i
    best = pipe.greedy(logits [k + 1, V], at)                   # [k + 1] argmax after the processors
    p = pipe.distributions(logits [k + 1, V], at)               # [k + 1, V] float probabilities
    hist.extend(row, accepted_tokens)                           # after the verdict; rejected drafts leave no trace
    # a batched verifier: at = Positions.cat([hist.draft(r, d_r, parents_r) for each row r]), logits [sum T, V]

`pipe.greedy` and `pipe.pick` at temperature 0 give the same tokens (the filters after the temperature never
remove the argmax), so a speculative method with temperature 0 equals `ar.greedy` with the same repetition
penalty, and with temperature > 0 samples exactly `ar.sample`'s distribution with the same parameters.

Stateful processors (the grammar mask of constraints/processor.py) follow `StatefulProcessor`: the pipeline
registers them with every History it makes; the History keeps each sequence's committed state and advances it with
the tokens appended / extended; a processor reads the state at each position with `at.states(self)` (the committed
state advanced along the position's drafted path, computed without mutating anything). Rolling back a rejected
draft is therefore free: only accepted tokens ever reach the History.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from . import processors as F
from .history import History, Positions
from .samplers import greedy as argmax
from .samplers import sample as draw


class Processor(Protocol):
    uses_history: bool

    def __call__(self, logits: torch.Tensor, at: Positions | None) -> torch.Tensor: ...


class StatefulProcessor(Processor, Protocol):
    """A processor with per-sequence state (e.g. a grammar automaton). States must be treated as immutable
    values: `advance` returns a new one (or the same object when nothing changes), so one committed state can
    be advanced along every path of a draft tree."""

    stateful: bool  # True

    def start(self) -> Any:
        """The state before any token (the History then advances it over the prompt)."""
        ...

    def advance(self, state: Any, token: int) -> Any:
        """The state after `token`."""
        ...


class RepetitionPenalty:
    """CTRL-style penalty on every token the position has seen (prompt, output, drafted tokens before it)."""

    uses_history = True

    def __init__(self, penalty: float) -> None:
        self.penalty = penalty

    def __call__(self, logits: torch.Tensor, at: Positions | None) -> torch.Tensor:
        assert at is not None, "the repetition penalty needs each position's history"
        return F.repetition_penalty(logits, at.seen(), self.penalty)


class _Filter:
    """A processor that reads only the logits: the pure function `apply(logits, value)` of `processors.py`."""

    uses_history = False
    apply: Callable[[torch.Tensor, Any], torch.Tensor]

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self, logits: torch.Tensor, at: Positions | None = None) -> torch.Tensor:
        return type(self).apply(logits, self.value)


class Temperature(_Filter):
    apply = staticmethod(F.temperature)


class TopK(_Filter):
    apply = staticmethod(F.top_k)


class TopP(_Filter):
    apply = staticmethod(F.top_p)


class MinP(_Filter):
    apply = staticmethod(F.min_p)


class SuppressTokens:
    """Tokens that are never produced (a diffusion model's MASK): their logits become -inf."""

    uses_history = False

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = list(ids)
        self._index: torch.Tensor | None = None  # the ids on the logits' device, made once (not one upload a call)

    def __call__(self, logits: torch.Tensor, at: Positions | None = None) -> torch.Tensor:
        if not self.ids:
            return logits
        if self._index is None or self._index.device != logits.device:
            self._index = torch.tensor(self.ids, device=logits.device)
        return logits.index_fill(-1, self._index, float("-inf"))


class LogitsPipeline:
    """Processors in order, then argmax (`sampling=False`) or a draw from the softmax."""

    def __init__(self, processors: Sequence[Processor] = (), sampling: bool = False) -> None:
        self.processors = list(processors)
        self.sampling = sampling

    @classmethod
    def from_config(cls, cfg: Any, suppress: Sequence[int] = (), constraint: Any = None) -> LogitsPipeline:
        """From any config with some of temperature / top_k / top_p / min_p / repetition_penalty (missing ones
        are off). At temperature 0 only the processors that can change the argmax are kept. A compiled
        `constraint` (constraints.Compiled) adds its grammar mask after the temperature and before the filters
        (as vLLM and SGLang apply it before sampling): top-k / top-p / min-p then choose among allowed tokens,
        so they never leave a position with none."""
        t = float(getattr(cfg, "temperature", 0.0))
        procs: list[Processor] = []
        if suppress:
            procs.append(SuppressTokens(suppress))
        penalty = float(getattr(cfg, "repetition_penalty", 1.0))
        if penalty != 1.0:
            procs.append(RepetitionPenalty(penalty))
        if t > 0:
            if t != 1.0:
                procs.append(Temperature(t))
        if constraint is not None:
            procs.append(constraint.processor())
        if t > 0:
            if getattr(cfg, "top_k", 0) > 0:
                procs.append(TopK(cfg.top_k))
            if getattr(cfg, "top_p", 1.0) < 1.0:
                procs.append(TopP(cfg.top_p))
            if getattr(cfg, "min_p", 0.0) > 0.0:
                procs.append(MinP(cfg.min_p))
        return cls(procs, sampling=t > 0)

    @property
    def constraint(self) -> Any:
        """The grammar mask (constraints.processor.GrammarMask), or None."""
        return next((p for p in self.processors if hasattr(p, "valid_prefix")), None)

    @property
    def uses_history(self) -> bool:
        """False when no processor looks at the history: callers may then pass `at=None`."""
        return any(getattr(p, "uses_history", False) for p in self.processors)

    @property
    def stateful(self) -> list[Processor]:
        return [p for p in self.processors if getattr(p, "stateful", False)]

    def history(self, ids: torch.Tensor, vocab_size: int, mask: torch.Tensor | None = None) -> History:
        """The History of R sequences `[R, L]` (padding where `mask` is 0 not counted), with the stateful
        processors' committed states."""
        return History.from_ids(ids, vocab_size, mask, self.stateful)

    def process(self, logits: torch.Tensor, at: Positions | None = None) -> torch.Tensor:
        """`[N, V]` logits -> `[N, V]` processed logits (-inf where a token is removed)."""
        for proc in self.processors:
            logits = proc(logits, at)
        return logits

    def greedy(self, logits: torch.Tensor, at: Positions | None = None) -> torch.Tensor:
        """`[N, V]` -> `[N]` argmax of the processed logits (ties to the lowest id)."""
        return argmax(self.process(logits, at))

    def distributions(self, logits: torch.Tensor, at: Positions | None = None) -> torch.Tensor:
        """`[N, V]` -> `[N, V]` float32 probabilities after every processor (temperature included)."""
        return self.process(logits, at).float().softmax(-1)

    def pick(self, logits: torch.Tensor, at: Positions | None, generator: torch.Generator | None) -> torch.Tensor:
        """`[N, V]` -> `[N]` tokens: the argmax, or one draw per row from `distributions`."""
        logits = self.process(logits, at)
        return draw(logits, generator) if self.sampling else argmax(logits)
