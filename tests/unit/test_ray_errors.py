"""`execute_on_ray` (fastdecode/bench/cluster.py) when a worker's item fails: the worker's error reaches the caller.
Its clean-up used to cancel the running actor tasks with `force=True`, which Ray refuses for actor tasks with a
ValueError raised over the worker's error (seen once under load in the device suite's rehearsal). A stand-in `ray`
module (the real one takes 10-20 s to start: tests/bench/test_ray.py) with Ray's behaviour on these calls."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest

from fastdecode.bench.cluster import execute_on_ray


class WorkerFailed(RuntimeError):
    pass


def _stand_in_ray() -> tuple[types.ModuleType, list]:
    calls: list = []
    ray = types.ModuleType("ray")

    class Actor:
        def __init__(self, i):
            self.run_item = SimpleNamespace(remote=lambda group, warmup: ("ref", i, len(calls)))

    ray.is_initialized = lambda: True
    ray.cluster_resources = lambda: {"CPU": 2}
    ray.remote = lambda **kw: (lambda cls: SimpleNamespace(remote=lambda i, *a: Actor(i)))
    ray.wait = lambda refs, num_returns: (refs[:1], refs[1:])

    def get(ref):
        raise WorkerFailed("the worker's item failed")

    def cancel(ref, force=False):
        calls.append(("cancel", force))
        if force:  # Ray: "force=True is not supported for actor tasks."
            raise ValueError("force=True is not supported for actor tasks.")

    ray.get, ray.cancel = get, cancel
    ray.kill = lambda actor: calls.append(("kill",))
    return ray, calls


def test_a_failed_item_raises_the_workers_error_and_stops_the_actors(monkeypatch):
    ray, calls = _stand_in_ray()
    monkeypatch.setitem(sys.modules, "ray", ray)
    jobs = [SimpleNamespace(task=SimpleNamespace(name=f"t{i}"), index=0, seed=1, is_baseline=True) for i in range(3)]
    with pytest.raises(WorkerFailed, match="the worker's item failed"):
        execute_on_ray(jobs, {}, lambda row: None, model="m", draft=None, load_kwargs={}, meta={}, warmup=False,
                       address=None, workers=2, threads=1, device_is_cuda=False)
    assert ("cancel", False) in calls and calls.count(("kill",)) == 2
