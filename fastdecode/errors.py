"""Errors raised by fastdecode. Every message says what went wrong and how to fix it."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class FastDecodeError(Exception):
    """Base class: the CLI prints these as a one-line message, without a traceback."""


class UnknownMethodError(FastDecodeError, KeyError):
    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0])


class IncompatibleMethodError(FastDecodeError, ValueError):
    """The method does not fit the model (kind, vocabulary, cache capabilities)."""


class ParameterError(FastDecodeError, ValueError):
    """A method parameter has an unknown name or an invalid value."""


class PromptError(FastDecodeError, ValueError):
    """A prompt is empty, or prompt plus generation does not fit the model."""


class ModelLoadError(FastDecodeError, OSError):
    """A model folder is missing, incomplete, corrupt or unsafe to load."""


def close_names(name: str, choices: Iterable[str], n: int = 3) -> str:
    """A "did you mean" suffix listing the closest of `choices`, or all of them if none is close."""
    choices = sorted(choices)
    if not choices:
        return "None are available."
    close = difflib.get_close_matches(name, choices, n=n, cutoff=0.5)
    if close:
        return f"Did you mean {', '.join(repr(c) for c in close)}?"
    return f"Choose one of: {', '.join(choices)}."
