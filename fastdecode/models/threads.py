"""The torch CPU thread count the command line uses when `--threads` is not given: one thread for a small model on
the CPU, torch's own choice (a thread per core) otherwise. The one rule `generate`, `bench` and `serve` share.

Why: a small model's forward is a chain of small matrix products; splitting each over threads costs more in
hand-offs than it saves, and where the cores are busy with other work a second thread waits for a core. Measured
with `tools/thread_speed.py` (docs/results/engine/threads.jsonl, a shared 2-core machine): one thread gave
zoo:ar-tiny's ar.greedy 184 tokens/s against 20 with two, zoo:ar-small 40 against 13, zoo:dlm-small's
dlm.baseline 2.3 against 0.4, and a random 33 M-parameter model 24 against 8. Larger models' products are big
enough to split on an idle many-core machine, so from `SMALL_MODEL_PARAMETERS` on torch's choice stands.

The library never applies this: `fastdecode.load` and `fastdecode.generate` leave torch's process-wide setting as
the caller has it. Only the CLI calls `cli_threads` (docs/cli.md).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors import safe_open

from ..errors import FastDecodeError
from .loading import check_weights, pick_device, resolve

# every zoo model (1.8 M to 10 M parameters) is below; one thread was still faster at 33 M and 134 M on the shared
# 2-core machine, but an idle machine with many cores splits a larger model's products profitably
SMALL_MODEL_PARAMETERS = 50_000_000


def default_threads(num_parameters: int | None, device: torch.device | str) -> int | None:
    """1 for a model under `SMALL_MODEL_PARAMETERS` on the CPU; None (torch's choice) for a larger or unknown one,
    or on a GPU, where the CPU threads only feed the device."""
    if torch.device(device).type != "cpu" or num_parameters is None:
        return None
    return 1 if num_parameters < SMALL_MODEL_PARAMETERS else None


def parameter_count(source: str | Path) -> int | None:
    """The parameters in a model folder's (or `zoo:NAME`'s) safetensors files, read from their headers without
    loading a weight; None where the folder cannot be read (loading it will say why)."""
    try:
        files = check_weights(resolve(source))
        total = 0
        for f in files:
            with safe_open(str(f), framework="pt") as handle:
                total += sum(math.prod(handle.get_slice(key).get_shape()) for key in handle.keys())
        return total
    except (FastDecodeError, OSError, ValueError):
        return None


def cli_threads(source: str | Path, threads: int | None, device: str | None) -> int | None:
    """The thread count the CLI sets before loading `source`: the user's `--threads`, else the default for the
    model's size on the device it will load on; None leaves torch's choice."""
    if threads is not None:
        return threads
    try:
        where = pick_device(device)  # the device `fastdecode.load` will pick
    except FastDecodeError:
        return None  # loading will refuse the device and say why
    return default_threads(parameter_count(source), where)
