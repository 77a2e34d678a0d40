"""Errors raised by fastdecode. Every message says what went wrong and how to fix it."""

from __future__ import annotations

import difflib
import os
import sys
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


class ArgumentError(FastDecodeError, TypeError):
    """An argument of the Python API has the wrong type (e.g. a model path where a loaded model belongs)."""


class DeviceError(FastDecodeError, ValueError):
    """A device that is not a device name, or that this machine or torch build does not have."""


class FastDecodeWarning(UserWarning):
    """Base class of the library's warnings; the CLI prints them as one line each."""


class ResultsFileWarning(FastDecodeWarning):
    """A results file holds lines that are not rows, or rows twice; they were skipped."""


def running_as_command_line() -> bool:
    """Whether this process is the `fastdecode` command (console script or `python -m fastdecode`)."""
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if any(a == "-m" and b == "fastdecode" for a, b in zip(argv, argv[1:])):
        return True
    return len(argv) > 1 and os.path.basename(argv[1]) in ("fastdecode", "fastdecode.exe")


def interrupted_while_importing() -> None:
    """Ctrl-C while the package imports torch: the command line exits 130 with one line instead of a traceback.
    In any other program the KeyboardInterrupt goes on (the caller re-raises it)."""
    if running_as_command_line() and os.environ.get("FASTDECODE_DEBUG") != "1":
        sys.stderr.write("interrupted\n")
        sys.exit(130)


def close_names(name: str, choices: Iterable[str], n: int = 3) -> str:
    """A "did you mean" suffix listing the closest of `choices`, or all of them if none is close."""
    choices = sorted(choices)
    if not choices:
        return "None are available."
    close = difflib.get_close_matches(name, choices, n=n, cutoff=0.5)
    if close:
        return f"Did you mean {', '.join(repr(c) for c in close)}?"
    return f"Choose one of: {', '.join(choices)}."
