"""One benchmark row: the job, its generation, its row dict and where it was measured.

What the local harness (`harness.py`) and a Ray worker (`cluster.py`) both run for each item, so neither reaches
into the other.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import transformers

from ..config import build_config
from ..engine import generate
from ..models.base import ModelAdapter
from ..models.loading import load
from ..registry import get_method
from ..speculative.memory import DrafterMemory
from .tasks import Item, Task, format_prompt
from .tasks.code import first_line_exact

# scores beyond the task's own scorer, by task name (all in [0, 1])
EXTRA_SCORES: dict[str, dict[str, Callable[[Item, str], float]]] = {
    "code.complete": {"first_line_exact": first_line_exact},
}


@dataclass(frozen=True)
class Job:
    """One generation to run: a method with its resolved parameters on one test item."""

    task: Task
    item: Item
    index: int  # position of the item in task.items(seed, n)
    seed: int
    method: str
    params: dict[str, Any]  # the method's full config, as a dict
    is_baseline: bool
    entry: str  # the --methods entry it came from: the method, or a configuration such as dlm.baseline:cache=dual
    default_budget: bool = True  # max_new_tokens is the task's default for this model, not a --param / entry value


def machine(device: torch.device) -> dict[str, Any]:
    """Where the numbers were measured."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = cpu_name() or platform.processor() or platform.machine()
    return {
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "device_name": name,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def precision(target: ModelAdapter) -> dict[str, Any]:
    """The target's dtype and exact mode (its block width, or None: off), which decide whether a lossless method can
    be told identical to its baseline (in low precision outside exact mode the rows report agreement instead),
    whether its forwards run as CUDA graphs (models/graphs.py, models/canvas_graphs.py) and whether through the fused
    kernels (models/native.py, models/mdlm.py: a setting whose rounding is its own)."""
    exact = getattr(target, "exact", None)
    return {"dtype": str(target.dtype).removeprefix("torch."), "exact": exact.width if exact is not None else None,
            "graphs": getattr(target, "graphs", None) is not None, "fused": bool(getattr(target, "fused", False))}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def versions() -> dict[str, str]:
    from .. import __version__

    return {"fastdecode_version": __version__, "torch_version": torch.__version__,
            "transformers_version": transformers.__version__}


def load_model(source: str | ModelAdapter | None,
               load_kwargs: Mapping[str, Any]) -> tuple[ModelAdapter | None, str | None]:
    """The model a bench run names (loaded) or is given, and the name its rows record."""
    if source is None or isinstance(source, ModelAdapter):
        return source, (source.name if source is not None else None)
    return load(source, **load_kwargs), str(source)


def item_key(row: Mapping[str, Any]) -> tuple[str, int, int]:
    return row["task"], row["item"], row["seed"]


def run_job(target: ModelAdapter, assistant: ModelAdapter | None, job: Job, memory: DrafterMemory | None = None,
              **override: Any):
    """One generation of `job`; drafters that learn across requests use `memory`, else one that starts empty and
    is dropped (never the target's own, so a benchmark leaves what the library remembers alone)."""
    memory = memory if memory is not None else DrafterMemory()
    return generate(target, format_prompt(job.item.prompt), job.method, draft=assistant, memory=memory,
                    **{**job.params, **override})


def preflight(target: ModelAdapter, assistant: ModelAdapter | None, jobs: list[Job]) -> None:
    """One short generation per method, so a method that cannot run fails before any row is written."""
    for job in jobs:
        try:  # the shortest generation the config accepts (diffusion block sizes must divide it)
            build_config(get_method(job.method).config, {**job.params, "max_new_tokens": 1}, job.method)
            short = {"max_new_tokens": 1}
        except ValueError:
            short = {}
        run_job(target, assistant, job, memory=None, **short)


def make_row(job: Job, target: ModelAdapter, assistant: ModelAdapter | None,
         meta: Mapping[str, Any], reference: Mapping[tuple[str, int, int], list[int]],
         memory: DrafterMemory) -> dict[str, Any]:
    result = run_job(target, assistant, job, memory)
    extra = EXTRA_SCORES.get(job.task.name, {})
    base = reference.get((job.task.name, job.index, job.seed))
    return {
        "suite": meta["suite"], "task": job.task.name, "item": job.index, "seed": job.seed, "method": job.method,
        "params": job.params, "default_budget": job.default_budget, "model": meta["model"], "draft": meta["draft"],
        "is_baseline": job.is_baseline, "baseline": meta["baseline"],
        "lossless": get_method(job.method).lossless,
        "score": job.task.score(job.item, result.text),
        "scores": {name: fn(job.item, result.text) for name, fn in extra.items()},
        "equal_to_baseline": True if job.is_baseline else (None if base is None else result.token_ids == base),
        **result.stats.to_dict(),
        "output": result.text, "token_ids": result.token_ids,
        **{k: v for k, v in meta.items() if k not in ("suite", "model", "draft", "baseline")},
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
