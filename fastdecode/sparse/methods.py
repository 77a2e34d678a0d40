"""The `sparse.*` methods, made from the rule table: one per registered attention rule, none written by hand.

`sparse.<rule>` is ar.greedy (temperature 0, the default) or ar.sample (temperature > 0) whose forwards read the
columns the rule selects; its config is the rule's, its description the rule's `description`. A rule file
registers its rule once (`attention.register_rule`) and `method_of`, watching the table, registers the method.

Each method's driver is a small class made per rule whose `__module__` is the rule's file (as `namedtuple` and
`make_dataclass` name their caller's module): the method index (docs/methods.md) and `inspect.getsourcefile` point at
the rule, where a reader finds what the method does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from ..ar.driver import autoregressive
from ..attention import Rule, SparseSelector
from ..registry import RunContext, register
from ..sampling.samplers import make_generator
from ..types import PromptBatch, StepEvent
from .base import SparseConfig


def sparse_decode(model: Any, batch: PromptBatch, cfg: SparseConfig, ctx: RunContext,
                  selector: SparseSelector) -> Iterator[StepEvent]:
    """ar.greedy (temperature 0) or ar.sample reading the columns `selector` chooses."""
    generator = None if cfg.greedy else make_generator(cfg.seed, ctx.generator, model.device)
    return autoregressive(model, batch, cfg, generator, constraint=ctx.constraint, sparse=selector)


class SparseRun:
    """The driver of one `sparse.*` method: calling it starts a run; iterating it yields the run's step events."""

    rule: ClassVar[Rule]

    def __init__(self, model: Any, batch: PromptBatch, cfg: SparseConfig, ctx: RunContext) -> None:
        # the selector refuses a model that cannot read a subset of its cache, before any step
        self._events = sparse_decode(model, batch, cfg, ctx, self.rule.selector(cfg, model=model))

    def __iter__(self) -> Iterator[StepEvent]:
        return self

    def __next__(self) -> StepEvent:
        return next(self._events)


def method_of(rule: Rule) -> None:
    """Register `sparse.<rule>`: the rule's config, its description, ar decoding through `SparseRun`."""
    name = "".join(part.title() for part in rule.name.split("_")) + "Run"
    driver = type(name, (SparseRun,), {"rule": rule, "__doc__": rule.description,
                                       "__module__": getattr(rule.selector, "__module__", __name__)})
    register(f"sparse.{rule.name}", kind="causal", config=rule.config)(driver)
