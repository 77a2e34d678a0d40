"""fastdecode: fast decoding methods for language models behind one interface, measured one way."""

from .errors import exit_on_interrupt_while_starting

exit_on_interrupt_while_starting()  # the command line: Ctrl-C while torch loads exits 130, without a traceback

# after that call on purpose (these import torch and transformers), hence the noqa: E402
from .engine import generate, stream  # noqa: E402
from .errors import (  # noqa: E402
    ArgumentError,
    DeviceError,
    FastDecodeError,
    IncompatibleMethodError,
    MissingDependencyError,
    ModelLoadError,
    ParameterError,
    PromptError,
    UnknownMethodError,
)
from .models import CausalLM, MaskedDiffusionLM, load  # noqa: E402
from .registry import Method, get_method, list_methods  # noqa: E402
from .stats import Stats  # noqa: E402
from .types import Finished, Result, StepEvent  # noqa: E402

__version__ = "0.1.0"


def methods(kind: str | None = None) -> list[Method]:
    """Registered methods, optionally only those for a model kind ("causal" or "diffusion")."""
    return list_methods(kind)  # type: ignore[arg-type]


__all__ = [
    "ArgumentError", "CausalLM", "DeviceError", "FastDecodeError", "Finished", "IncompatibleMethodError",
    "MaskedDiffusionLM", "Method", "MissingDependencyError", "ModelLoadError", "ParameterError", "PromptError",
    "Result", "Stats", "StepEvent",
    "UnknownMethodError",
    "__version__", "generate", "get_method", "load", "methods", "stream",
]
