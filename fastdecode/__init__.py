"""fastdecode: fast decoding methods for language models behind one interface, measured one way.

`import fastdecode` is light: the names that need torch and transformers (`load`, `generate`, `stream`, the
model and result classes, the registry) are imported on first use, so that `fastdecode --help` and a program
that only catches `fastdecode.FastDecodeError` do not pay seconds for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    ArgumentError,
    DeviceError,
    FastDecodeError,
    IncompatibleMethodError,
    MissingDependencyError,
    ModelLoadError,
    ParameterError,
    PromptError,
    UnknownMethodError,
    exit_on_interrupt_while_starting,
)

exit_on_interrupt_while_starting()  # the command line: Ctrl-C while torch loads exits 130, without a traceback

if TYPE_CHECKING:  # what the lazy names below resolve to, for type checkers and editors
    from .engine import generate, stream
    from .models import CausalLM, MaskedDiffusionLM, load
    from .registry import Method, get_method
    from .stats import Stats
    from .types import Finished, Result, StepEvent

__version__ = "0.1.0"

# public name -> the submodule that defines it, imported on first access (PEP 562)
_LAZY = {
    "generate": "engine", "stream": "engine",
    "CausalLM": "models", "MaskedDiffusionLM": "models", "load": "models",
    "Method": "registry", "get_method": "registry", "list_methods": "registry",
    "Stats": "stats",
    "Finished": "types", "Result": "types", "StepEvent": "types",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fastdecode' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later look-ups (and monkeypatching) find it without this hook
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def methods(kind: str | None = None) -> list[Method]:
    """Registered methods, optionally only those for a model kind ("causal" or "diffusion")."""
    if kind not in (None, "causal", "diffusion"):  # refused before the registry (and torch) is imported
        raise ArgumentError(f"kind must be 'causal' or 'diffusion', not {kind!r} (or leave it out for every method).")
    from .registry import list_methods

    return list_methods(kind)  # type: ignore[arg-type]


__all__ = [
    "ArgumentError", "CausalLM", "DeviceError", "FastDecodeError", "Finished", "IncompatibleMethodError",
    "MaskedDiffusionLM", "Method", "MissingDependencyError", "ModelLoadError", "ParameterError", "PromptError",
    "Result", "Stats", "StepEvent",
    "UnknownMethodError",
    "__version__", "generate", "get_method", "load", "methods", "stream",
]
