"""Method configurations: one frozen dataclass per method is its single source of truth.

Parameters arrive from Python (`generate(..., top_k=5)`) or from the CLI as strings (`--param top_k=5`);
`build_config` turns either into a validated config and names the fix when something is wrong.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

from .errors import ParameterError, close_names

C = TypeVar("C", bound="MethodConfig")


@dataclass(frozen=True)
class MethodConfig:
    """Parameters every method takes."""

    max_new_tokens: int = 64

    def __post_init__(self) -> None:
        check(self.max_new_tokens >= 1, "max_new_tokens", self.max_new_tokens, "must be at least 1")


def check(ok: bool, name: str, value: Any, rule: str) -> None:
    """Raise a ParameterError naming the parameter, its bad value and the rule it breaks."""
    if not ok:
        raise ParameterError(f"Parameter {name}={value!r} is invalid: it {rule}.")


def param_names(config_cls: type[MethodConfig]) -> list[str]:
    return [f.name for f in dataclasses.fields(config_cls)]


def build_config(config_cls: type[C], params: dict[str, Any], method: str = "") -> C:
    """Validate names, coerce string values to the declared field types and construct the config."""
    hints = typing.get_type_hints(config_cls)
    known = param_names(config_cls)
    kwargs: dict[str, Any] = {}
    for name, value in params.items():
        if name not in known:
            where = f" of method {method!r}" if method else ""
            raise ParameterError(
                f"Unknown parameter {name!r}{where}. {close_names(name, known)} "
                f"(`fastdecode methods` lists every method's parameters.)"
            )
        kwargs[name] = coerce_value(name, value, hints[name])
    return config_cls(**kwargs)


def coerce_value(name: str, value: Any, hint: Any) -> Any:
    """Coerce `value` to `hint` (bool, int, float, str, Literal, or Optional of those)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() == "none"):
            return None
        hint = options[0] if len(options) == 1 else hint
        origin = typing.get_origin(hint)
    if origin is typing.Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            choices = ", ".join(map(repr, allowed))
            raise ParameterError(f"Parameter {name}={value!r} is invalid: choose one of {choices}.")
        return value
    try:
        if hint is bool:
            return _to_bool(value)
        if hint is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if hint is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if hint is str:
            return str(value)
    except (TypeError, ValueError):
        raise ParameterError(
            f"Parameter {name}={value!r} is invalid: expected a value of type {hint.__name__}."
        ) from None
    return value


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return value.lower() in ("1", "true", "yes", "on")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError


def parse_param_strings(items: list[str]) -> dict[str, str]:
    """Parse CLI `k=v` strings into a dict, refusing malformed items."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ParameterError(f"Cannot read --param {item!r}: write it as name=value, e.g. --param top_k=5.")
        out[key.strip()] = value.strip()
    return out
