"""Long-context sparse decoding (`sparse.*`): each decode step reads a budget of cached key/value columns per head.

Every rule is one file with a `Selector` subclass (`base.py`: the hook, the always-kept sinks and recent window,
the budget, the read accounting) and registers two things through `register_rule`:

- a method `sparse.<rule>`: ar.greedy (temperature 0, the default) or ar.sample (temperature > 0) whose forwards
  read the columns the rule selects;
- the rule itself, so that any method with an `attention` parameter can use it: `attention="quest"` or with the
  rule's parameters, `attention="quest:budget=128,page=16"` (ar.greedy, ar.sample and every spec.* method).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..config import build_config
from ..errors import ParameterError, close_names
from ..registry import RunContext
from ..sampling.samplers import make_generator
from ..types import PromptBatch, StepEvent
from .base import Selector, SparseConfig


@dataclass(frozen=True)
class Rule:
    name: str
    selector: type[Selector]
    config: type[SparseConfig]


RULES: dict[str, Rule] = {}
DENSE = "dense"


def register_rule(name: str, selector: type[Selector], config: type[SparseConfig]) -> None:
    """Make the rule usable as an `attention=` value (its file registers the method `sparse.<name>` itself)."""
    RULES[name] = Rule(name, selector, config)


def check_model(model: Any) -> None:
    """Refuse, before the first step, a model whose attention cannot read a subset of the cache."""
    if not getattr(model, "preallocated", False):
        from ..errors import IncompatibleMethodError

        raise IncompatibleMethodError(
            f"Sparse attention reads a subset of fastdecode's preallocated KV cache, which "
            f"{getattr(model, 'name', 'this model')!r} cannot use (its layers are not all plain attention through "
            "transformers' attention interface). Use dense attention (ar.greedy, or attention='dense').")


def sparse_decode(model: Any, batch: PromptBatch, cfg: SparseConfig, ctx: RunContext,
                  selector: type[Selector]) -> Iterator[StepEvent]:
    """The driver of every `sparse.*` method: ar.greedy (temperature 0) or ar.sample reading the rule's columns."""
    from ..ar.driver import autoregressive

    check_model(model)
    generator = None if cfg.greedy else make_generator(cfg.seed, ctx.generator, model.device)
    return autoregressive(model, batch, cfg, generator, constraint=ctx.constraint, sparse=selector(cfg, model=model))


def parse_attention(text: str) -> tuple[str, dict[str, str]]:
    """"quest:budget=128,page=16" -> ("quest", {"budget": "128", "page": "16"})."""
    name, _, rest = text.strip().partition(":")
    params: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ParameterError(
                f"Cannot read attention={text!r}: write the rule's parameters as name=value separated by commas, "
                "e.g. attention='quest:budget=128,page=16'."
            )
        params[key.strip()] = value.strip()
    return name.strip(), params


def rules() -> list[str]:
    """Names of the registered rules (every `sparse.*` method's)."""
    from ..registry import _load_builtins

    _load_builtins()
    return sorted(RULES)


def check_attention(text: str) -> None:
    """Validate an `attention` parameter value (its rule and the rule's parameters)."""
    make_selector(text, None)


def make_selector(text: str, model: Any, **defaults: Any) -> Selector | None:
    """The selector an `attention` parameter names (None for dense); `defaults` fill parameters not given. With a
    model, one that cannot run sparse attention is refused here, before any step."""
    from ..registry import _load_builtins

    _load_builtins()
    name, params = parse_attention(text)
    if name == DENSE:
        if params:
            raise ParameterError(f"attention={text!r}: dense attention takes no parameters.")
        return None
    if name not in RULES:
        raise ParameterError(
            f"Unknown attention rule {name!r}. {close_names(name, [DENSE, *RULES])} "
            "(each sparse.* method's rule, or 'dense')."
        )
    rule = RULES[name]
    known = {f for f in rule.config.__dataclass_fields__}
    merged = {k: v for k, v in defaults.items() if k in known}
    merged.update(params)
    cfg = build_config(rule.config, merged, f"sparse.{name}")
    if model is not None:
        check_model(model)
    return rule.selector(cfg, model=model)


__all__ = ["DENSE", "RULES", "Rule", "Selector", "SparseConfig", "check_attention", "check_model", "make_selector",
           "parse_attention", "register_rule", "rules", "sparse_decode"]
