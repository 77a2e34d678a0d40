"""Errors raised by fastdecode. Every message says what went wrong and how to fix it."""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Iterable
from types import FrameType


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


class MissingDependencyError(FastDecodeError, ImportError):
    """A method or feature needs an optional package that is not installed; the message names the pip command."""


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
    if any(a == "-m" and b == "fastdecode" for a, b in zip(argv, argv[1:], strict=False)):
        return True
    return len(argv) > 1 and os.path.basename(argv[1]) in ("fastdecode", "fastdecode.exe")


def exit_on_interrupt_while_starting() -> None:
    """In the command line, Ctrl-C while a module is being imported ends it at once: one line, exit 130.

    A KeyboardInterrupt raised inside the imports of torch and transformers does not reliably surface as one
    (transformers' lazy importer turns it into a ModuleNotFoundError or a RecursionError). The command line
    imports them lazily, inside its commands, so the handler stays for the whole run: during an import it exits,
    anywhere else it raises KeyboardInterrupt as Python does (the commands turn that into exit 130 and may first
    say what was kept). Any other program is left alone.
    """
    import signal

    if not running_as_command_line() or os.environ.get("FASTDECODE_DEBUG") == "1":
        return
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _exit_interrupted)
    except ValueError:  # not the main thread
        pass


def _exit_interrupted(signum: int, frame: FrameType | None) -> None:
    if not _importing(frame):
        raise KeyboardInterrupt
    os.write(2, b"interrupted\n")
    os._exit(130)  # nothing written yet that could be lost; half-imported modules must not run on


def _importing(frame: FrameType | None) -> bool:
    """Whether a frame on this stack belongs to Python's import machinery."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def interrupts_raise_again() -> None:
    """Undo `exit_on_interrupt_while_starting`: from here Ctrl-C raises KeyboardInterrupt, even in an import."""
    import signal

    if signal.getsignal(signal.SIGINT) is _exit_interrupted:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def close_names(name: str, choices: Iterable[str], n: int = 3) -> str:
    """A "did you mean" suffix listing the closest of `choices`, or all of them if none is close."""
    choices = sorted(choices)
    if not choices:
        return "None are available."
    close = difflib.get_close_matches(name, choices, n=n, cutoff=0.5)
    if close:
        return f"Did you mean {', '.join(repr(c) for c in close)}?"
    return f"Choose one of: {', '.join(choices)}."
