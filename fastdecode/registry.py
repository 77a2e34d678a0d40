"""The method registry: `@register("ar.greedy", ...)` on a driver; CLI, bench and tests enumerate it."""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from . import plugins
from .attention import is_dense, parse_attention
from .config import MethodConfig
from .errors import ParameterError, UnknownMethodError, close_names
from .session import SessionFactory, driver_session
from .types import ModelKind, PromptBatch, StepEvent

# A driver runs one method: it owns every model call and yields one event per step. Its config is an instance of the
# method's own `config` class, hence Any here (register's signature ties the two together for the type checker).
Driver = Callable[[Any, PromptBatch, Any, "RunContext"], Iterator[StepEvent]]
C = TypeVar("C", bound=MethodConfig)
DriverOf = Callable[[Any, PromptBatch, C, "RunContext"], Iterator[StepEvent]]  # a driver taking config class C

_METHODS: dict[str, Method] = {}


@dataclass(frozen=True)
class RunContext:
    """Run-time objects a driver may need that are not configuration values."""

    generator: Any = None  # torch.Generator for sampling methods, or None
    draft: Any = None  # drafter model adapter for methods that take one
    # DrafterMemory (speculative/memory.py) of drafters that learn across requests; None: the target model's own
    memory: Any = None
    constraint: Any = None  # constraints.Compiled for this request, or None
    # polled by a method that runs another runtime's loop to completion (llamacpp.*) before each of its forwards:
    # True stops the loop there, and the rows end with what they have (the server's timeout and disconnect)
    should_stop: Callable[[], bool] | None = None


@dataclass(frozen=True)
class ConstraintSupport:
    """What a method does with `constraint=`, declared where it registers: `constraints.support.check` reads it before
    a request compiles its constraint, and refuses with the method's own reason and fix."""

    # why it cannot apply a constraint at all, and what to use instead, completing "it ..."; "" = it can
    refused: str = ""
    # the constraint sampling modes it honours: "mask" (the grammar mask), "gad" (Grammar-Aligned Decoding)
    sampling: tuple[str, ...] = ("mask", "gad")
    # why a mode outside `sampling` cannot apply, and what to use instead
    why: str = ""


EVERY_CONSTRAINT = ConstraintSupport()  # the default: the grammar mask and GAD both apply


@dataclass(frozen=True)
class Method:
    name: str
    kind: ModelKind
    config: type[MethodConfig]
    driver: Driver
    description: str
    lossless: bool  # greedy output equals ar.greedy / dlm.baseline token for token
    needs_draft: bool = False  # takes a separate draft model (generate(..., draft=...), CLI --draft)
    draft_kind: ModelKind = "causal"  # the kind of model that draft must be
    # optional packages imported when it runs: (module, pip requirement), e.g. ("llama_cpp", "llama-cpp-python")
    requires: tuple[tuple[str, str], ...] = ()
    # how its requests join a running batch between steps (`fastdecode serve`, `session.py`); None: they never do
    session: SessionFactory | None = None
    drafts: bool = False  # its events' proposed / accepted count drafted tokens (serve's usage and spec_decode metrics)
    constraints: ConstraintSupport = EVERY_CONSTRAINT
    # it reads an image model's grid or codebook (`model.image`), so text models are refused before the first step
    images_only: bool = False

    def missing(self) -> list[str]:
        """The pip requirements of `requires` whose module is not installed."""
        return [pip for module, pip in self.requires if importlib.util.find_spec(module) is None]

    def check_attention(self, attention: Any) -> None:
        """Refuse a sparse `attention` rule on a method registered lossless: the rule changes every forward (the
        verifying ones of spec.* included), so the output would no longer be its baseline's, and a method's lossless
        claim holds for every parameter it accepts. The error names the method that does what was asked."""
        if not self.lossless or is_dense(attention):
            return
        rule = parse_attention(str(attention))[0]
        if "rule" in {f.name for f in dataclasses.fields(self.config)}:  # spec.sparse_self: its drafts' rule
            fix = f"give it as rule={attention!r} (the drafts read it, the verification stays dense)"
        elif self.drafts:
            fix = (f"for sparse drafts verified densely (lossless) use spec.sparse_self with rule={attention!r}; for "
                   f"sparse decoding without drafts use sparse.{rule}")
        else:
            fix = f"use the method sparse.{rule}, with the rule's parameters as its own (e.g. budget=256)"
        raise ParameterError(
            f"Method {self.name!r} is registered lossless (its output equals its baseline's token for token), and "
            f"attention={attention!r} would make it read only part of its cache: {fix}; or leave attention dense.")

    def params(self) -> list[tuple[str, Any]]:
        """(name, default) for each parameter."""
        return [(f.name, f.default) for f in dataclasses.fields(self.config)]


def register(
    name: str, *, kind: ModelKind, config: type[C], lossless: bool = False, needs_draft: bool = False,
    draft_kind: ModelKind = "causal", requires: tuple[tuple[str, str], ...] = (),
    session: SessionFactory | Literal["driver"] | None = None, drafts: bool = False,
    constraints: ConstraintSupport = EVERY_CONSTRAINT, images_only: bool = False,
) -> Callable[[DriverOf[C]], DriverOf[C]]:
    """Register `driver` under `name`; the first line of its docstring is the description. What others look up about
    the method is declared here, never inferred from its name: `session` (how its requests join a running batch;
    "driver": the driver itself returns the Session), `drafts` and `constraints`."""

    def wrap(driver: DriverOf[C]) -> DriverOf[C]:
        if name in _METHODS:
            raise ValueError(f"method {name!r} is registered twice")
        doc = (driver.__doc__ or "").strip().splitlines()
        factory = driver_session(driver) if isinstance(session, str) else session
        _METHODS[name] = Method(name, kind, config, driver, doc[0] if doc else "", lossless, needs_draft, draft_kind,
                                requires, factory, drafts, constraints, images_only)
        return driver

    return wrap


def _load_builtins() -> None:
    """The method families are discovered, not listed: every module under their packages registers itself by
    existing (`plugins.FAMILIES`)."""
    plugins.load()


def get_method(name: str) -> Method:
    _load_builtins()
    if name not in _METHODS:
        raise UnknownMethodError(
            f"Unknown method {name!r}. {close_names(name, _METHODS)} (`fastdecode methods` lists them.)"
        )
    return _METHODS[name]


def list_methods(kind: ModelKind | None = None) -> list[Method]:
    _load_builtins()
    return [m for _, m in sorted(_METHODS.items()) if kind is None or m.kind == kind]
