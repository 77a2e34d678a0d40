"""fastdecode: fast decoding methods for language models behind one interface, measured one way."""

from .errors import exit_on_interrupt_while_starting

exit_on_interrupt_while_starting()  # the command line: Ctrl-C while torch loads exits 130, without a traceback

from .engine import generate, stream
from .errors import (
    ArgumentError,
    DeviceError,
    FastDecodeError,
    IncompatibleMethodError,
    ModelLoadError,
    ParameterError,
    PromptError,
    UnknownMethodError,
)
from .models import CausalLM, MaskedDiffusionLM, load
from .registry import Method, get_method, list_methods
from .stats import Stats
from .types import Finished, Result, StepEvent

__version__ = "0.1.0"


def methods(kind: str | None = None) -> list[Method]:
    """Registered methods, optionally only those for a model kind ("causal" or "diffusion")."""
    return list_methods(kind)  # type: ignore[arg-type]


__all__ = [
    "ArgumentError", "CausalLM", "DeviceError", "FastDecodeError", "Finished", "IncompatibleMethodError", "MaskedDiffusionLM", "Method",
    "ModelLoadError", "ParameterError", "PromptError", "Result", "Stats", "StepEvent", "UnknownMethodError",
    "__version__", "generate", "get_method", "load", "methods", "stream",
]
