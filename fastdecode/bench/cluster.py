"""`fastdecode bench --ray`: the same jobs as a local run, spread over the workers of a Ray cluster.

One worker (a Ray actor) per device: it loads the target (and draft) once and runs whole items: every
configuration's row of an item, the baseline's first, as the local harness interleaves them. So each configuration
runs on the same worker as the baseline rows it is compared with; each worker is a run of its own (`run` =
the invocation's id + `-wN`, `machine` = the worker's), and the report divides a row only by its own run's baseline.
Rows come back item by item to this process, the one writer of the resumable JSONL file.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..models.base import ModelAdapter
from ..speculative.memory import DrafterMemory
from .jobs import item_key, load_model, machine, make_row, preflight, run_job
from .suites import BenchError


class BenchWorker:
    """What runs inside one Ray actor: the models, loaded once, and each configuration's drafter memory."""

    def __init__(self, index: int, model: str | ModelAdapter, draft: str | ModelAdapter | None,
                 load_kwargs: Mapping[str, Any], meta: Mapping[str, Any], threads: int | None,
                 reference: Mapping[tuple[str, int, int], list[int]]) -> None:
        import torch

        if threads is not None:
            torch.set_num_threads(threads)
        target, _ = load_model(model, load_kwargs)
        assert target is not None
        self.target: ModelAdapter = target
        self.assistant, _ = load_model(draft, load_kwargs)
        self.meta = {**meta, "machine": machine(self.target.device), "run": f"{meta['run']}-w{index}"}
        self.reference = dict(reference)
        self.memories: dict[str, DrafterMemory] = {}
        self.ready: set[str] = set()

    def run_item(self, jobs: list[Any], warmup: bool) -> list[dict[str, Any]]:
        """Every pending row of one item, the baseline's first; a configuration this worker has not run yet is
        pre-flighted (and warmed up) first, as the local harness does before its first row."""
        rows = []
        for job in jobs:
            if job.entry not in self.ready:
                preflight(self.target, self.assistant, [job])
                if warmup:
                    run_job(self.target, self.assistant, job)
                self.ready.add(job.entry)
                self.memories[job.entry] = DrafterMemory()
            row = make_row(job, self.target, self.assistant, self.meta, self.reference, self.memories[job.entry])
            if job.is_baseline:
                self.reference[item_key(row)] = row["token_ids"]
            rows.append(row)
        return rows


def execute_on_ray(jobs: Sequence[Any], reference: Mapping[tuple[str, int, int], list[int]],
                   write: Callable[[dict[str, Any]], None], *, model: str | ModelAdapter,
                   draft: str | ModelAdapter | None, load_kwargs: Mapping[str, Any], meta: Mapping[str, Any],
                   warmup: bool, address: str | None, workers: int | None, threads: int | None,
                   device_is_cuda: bool) -> int:
    """Run the pending `jobs` on Ray workers, calling `write(row)` for each row as its item comes back (in this
    process, so there is one writer); returns the number of workers used."""
    try:
        ray: Any = importlib.import_module("ray")
    except ImportError:
        raise BenchError("--ray needs Ray: pip install 'fastdecode[ray]' (on every node of the cluster).") from None
    if not ray.is_initialized():
        ray.init(address=address or None, include_dashboard=False, log_to_driver=False)
    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0)) if device_is_cuda else 0
    per_worker = {"num_gpus": 1, "num_cpus": 1} if gpus else {"num_cpus": threads or 1}
    if workers is None:
        workers = gpus if gpus else max(1, int(resources.get("CPU", 1)) // (threads or 1))
    # items, in the plan's order: each item's rows go to one worker together
    items: dict[tuple[str, int, int], list[Any]] = {}
    for job in jobs:
        items.setdefault((job.task.name, job.index, job.seed), []).append(job)
    groups = [sorted(todo, key=lambda j: not j.is_baseline) for todo in items.values()]
    workers = max(1, min(workers, len(groups)))
    actor = ray.remote(**per_worker)(BenchWorker)
    pool = [actor.remote(i, model, draft, dict(load_kwargs), dict(meta), threads, dict(reference))
            for i in range(workers)]
    queue = list(reversed(groups))
    running: dict[Any, int] = {}
    for w in range(workers):
        if queue:
            running[pool[w].run_item.remote(queue.pop(), warmup)] = w
    try:
        while running:
            done, _ = ray.wait(list(running), num_returns=1)
            w = running.pop(done[0])
            for row in ray.get(done[0]):
                write(row)
            if queue:
                running[pool[w].run_item.remote(queue.pop(), warmup)] = w
    finally:  # (an actor task cannot be cancelled with force=True: that raised over the error that brought us here)
        for ref in running:
            ray.cancel(ref)
        for a in pool:
            ray.kill(a)
    return workers
