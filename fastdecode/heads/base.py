"""The head contract: a trained part that is not a whole model, its frozen config, the target it was trained on.

Drafter heads (EAGLE-3's fc + one decoder layer + reduced-vocabulary lm_head, Medusa's residual blocks, DFlash's
block drafter), filters (Learn2PD) and one-step generators (DD1/DD2) are small modules that read a target model's
features or tokens. Each kind is one `Head` subclass with its own frozen `HeadConfig` subclass, registered by name
with `@register_head("kind")` so that `load_head` can rebuild it from a folder's config.json alone.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from torch import nn

from ..errors import IncompatibleMethodError, ModelLoadError, close_names


@dataclass(frozen=True)
class HeadConfig:
    """Base of every head kind's config: its shape and options, one frozen record saved as JSON.

    Fields must be JSON values (numbers, strings, booleans, None, tuples/lists of them, string-keyed dicts); lists
    read back from JSON become tuples, so declare sequence fields as tuples. `kind` names the head kind this config
    belongs to; `register_head` sets it on the config class.
    """

    kind: ClassVar[str] = ""


@dataclass(frozen=True)
class Target:
    """The model a head was trained against, as saved beside it: enough to refuse a head on another model."""

    name: str = ""  # e.g. "zoo:ar-small" or the folder's name
    architecture: str = ""  # transformers class, e.g. "LlamaForCausalLM"
    hidden_size: int = 0
    num_layers: int = 0
    vocab_size: int = 0

    @classmethod
    def of(cls, model: Any) -> Target:
        """The target record of a loaded model adapter (`fastdecode.load(...)`)."""
        config = model.config
        return cls(name=str(getattr(model, "name", "")), architecture=type(model.model).__name__,
                   hidden_size=int(getattr(config, "hidden_size", 0) or 0),
                   num_layers=int(getattr(config, "num_hidden_layers", 0) or 0),
                   vocab_size=int(getattr(config, "vocab_size", 0) or 0))

    def check(self, model: Any, what: str = "this head") -> None:
        """Refuse `model` if its shape differs from the target's in a field the record states (0/"" = unknown)."""
        found = Target.of(model)
        wrong = [f"{f} {getattr(found, f)} (trained on {getattr(self, f)})"
                 for f in ("architecture", "hidden_size", "num_layers", "vocab_size")
                 if getattr(self, f) and getattr(self, f) != getattr(found, f)]
        if wrong:
            raise IncompatibleMethodError(
                f"{what} was trained against {self.name or 'another model'!r}, but {found.name!r} has "
                f"{', '.join(wrong)}: load the head trained for this model, or train one (fastdecode train)."
            )


class Head(nn.Module):
    """Base of every trained head: a torch module built from its config alone (weights come from the folder).

    `kind` and `config_class` are set by `register_head`; `target` records the model the head was trained against
    (saved in config.json, None when unknown).
    """

    kind: ClassVar[str] = ""
    config_class: ClassVar[type[HeadConfig]] = HeadConfig

    def __init__(self, config: HeadConfig, target: Target | None = None) -> None:
        super().__init__()
        if not isinstance(config, self.config_class):
            raise TypeError(f"{type(self).__name__} takes a {self.config_class.__name__}, got {type(config).__name__}")
        self.config = config
        self.target = target

    @classmethod
    def for_target(cls, model: Any, **options: Any) -> Head:
        """A freshly initialised head shaped for `model` (a loaded `CausalLM`), options as its config's fields; its
        `Target` record is `Target.of(model)`. What training starts from."""
        raise NotImplementedError(f"head kind {cls.kind!r} does not build itself for a target: write for_target")

    @classmethod
    def untrained(cls, model: Any, seed: int = 0) -> Head:
        """A seeded, randomly initialised head for `model`: what tests decode with where no trained head exists
        (`heads.io.untrained_heads_allowed`). A lossless method stays lossless with it; it only accepts less."""
        raise NotImplementedError(f"head kind {cls.kind!r} has no untrained form: write untrained")


_KINDS: dict[str, type[Head]] = {}
_found = False


def _discover() -> None:
    """Import every module of this package once: a head kind registers itself by existing (one file a kind)."""
    global _found
    if _found:
        return
    package = importlib.import_module(__name__.rpartition(".")[0])
    for module in pkgutil.iter_modules(package.__path__, prefix=package.__name__ + "."):
        importlib.import_module(module.name)
    _found = True
H = TypeVar("H", bound=type[Head])


def register_head(kind: str) -> Callable[[H], H]:
    """Class decorator: make a `Head` subclass loadable by `kind` (the name saved in config.json).

    The class names its config with `config_class`, a frozen dataclass subclassing `HeadConfig`."""

    def add(cls: H) -> H:
        if not (isinstance(cls, type) and issubclass(cls, Head)):
            raise TypeError(f"@register_head({kind!r}) decorates Head subclasses, not {cls!r}")
        config = cls.config_class
        params = vars(config).get("__dataclass_params__")  # its own @dataclass, not only the inherited one
        if config is HeadConfig or not issubclass(config, HeadConfig) or params is None or not params.frozen:
            raise TypeError(f"{cls.__name__}.config_class must be its own frozen dataclass subclassing HeadConfig")
        known = _KINDS.get(kind)
        if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"head kind {kind!r} is already registered by {known.__module__}.{known.__qualname__}")
        owner = vars(config).get("kind")  # its own, not a config it extends (Hydra's extends Medusa's)
        if owner and owner != kind:
            raise ValueError(f"{config.__name__} already belongs to head kind {owner!r}")
        cls.kind = kind
        config.kind = kind
        _KINDS[kind] = cls
        return cls

    return add


def head_kinds() -> list[str]:
    """The registered head kinds, sorted."""
    _discover()
    return sorted(_KINDS)


def head_class(kind: str) -> type[Head]:
    """The head class registered as `kind`; an unknown kind is refused with the known ones listed."""
    _discover()
    found = _KINDS.get(kind)
    if found is None:
        raise ModelLoadError(f"Unknown head kind {kind!r}. {close_names(kind, _KINDS)} (A head kind is registered "
                             "when the module defining it, with @register_head, is imported.)")
    return found


def config_fields(config: HeadConfig) -> dict[str, Any]:
    """A config's fields as JSON values (tuples as lists)."""
    return dataclasses.asdict(config)


def config_from(kind: str, fields: dict[str, Any]) -> HeadConfig:
    """Rebuild `kind`'s config from saved fields: lists back to tuples, unknown or missing fields refused."""
    cls = head_class(kind).config_class
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise ModelLoadError(f"config.json gives fields {unknown} that head kind {kind!r} does not have "
                             f"({', '.join(sorted(names)) or 'none'}); it was saved by another version of this head.")
    try:
        return cls(**{k: _frozen(v) for k, v in fields.items()})
    except TypeError as e:
        raise ModelLoadError(f"config.json does not describe a {kind!r} head: {e}.") from None


def _frozen(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return {k: _frozen(v) for k, v in value.items()}
    return value
