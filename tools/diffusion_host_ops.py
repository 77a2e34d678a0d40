"""Count the host work of a diffusion step outside the model's forward (issue #30: on a GPU each torch operation is a
kernel launch or a dispatch, and each read of a tensor's value a device synchronisation; once the forward is one
CUDA-graph replay, what is left of a step's host cost is the driver and the policy, `fastdecode/diffusion/`).

Runs one generation per method under `torch.profiler` (CPU), one profile per driver step (`StepEvent`), with
`MaskedDiffusionLM.forward` / `forward_columns` wrapped in a `record_function` range, and prints per step:

- ops: `aten::*` operations outside that range (nested ones counted too: an `aten::to` and the `aten::copy_` it
  runs are two);
- syncs: reads of a tensor's value on the host, each a device synchronisation on a GPU: `aten::_local_scalar_dense`
  (`.item()`, `int(t)`, `bool(t)`, `float(t)`), `aten::nonzero` (also inside boolean-mask indexing `x[mask]`),
  `aten::masked_select`, `aten::equal`, and calls of `Tensor.tolist` (which dispatches no read on a CPU tensor, so it
  is counted where it is called);
- uploads: `torch.tensor(<host data>)` (`aten::lift_fresh`), a host-to-device copy on a GPU.

The last line per method is the mean per step over the whole generation (its first step also builds the canvas).

    python tools/diffusion_host_ops.py --threads 1
    python tools/diffusion_host_ops.py --method dlm.threshold --new-tokens 64 --steps   # every step's row
    python tools/diffusion_host_ops.py --method dlm.baseline --lines 15  # where the ops come from
    python tools/diffusion_host_ops.py --jsonl docs/results/diffusion/host-ops.jsonl --state after
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import subprocess
import sys
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fastdecode  # noqa: E402
from fastdecode.models.diffusion import MaskedDiffusionLM  # noqa: E402
from fastdecode.types import StepEvent  # noqa: E402

FORWARD = "fastdecode.model_forward"  # the record_function range around the model's forwards
SYNCS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::equal")
METHODS = ("dlm.baseline", "dlm.threshold", "dlm.freedave", "dlm.localleap")
PROMPT = "Sort the numbers 42 7 19 3 88 and list them from smallest to largest.\n"


@dataclass
class Count:
    """One step's host work outside the forward."""

    ops: int = 0
    syncs: int = 0
    uploads: int = 0
    forward_ops: int = 0
    forwards: int = 0


class Tolist:
    """Counts `Tensor.tolist` calls outside the forward (a CPU tensor's `tolist` dispatches no read)."""

    def __init__(self) -> None:
        self.calls, self.depth = 0, 0

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        original_tolist = torch.Tensor.tolist
        originals = {name: getattr(MaskedDiffusionLM, name) for name in ("forward", "forward_columns")}

        def tolist(tensor: torch.Tensor) -> Any:
            self.calls += self.depth == 0
            return original_tolist(tensor)

        def wrap(fn: Any) -> Any:
            def inside(*args: Any, **kwargs: Any) -> Any:
                self.depth += 1
                try:
                    with record_function(FORWARD):
                        return fn(*args, **kwargs)
                finally:
                    self.depth -= 1
            return inside

        torch.Tensor.tolist = tolist  # type: ignore[assignment]
        for name, fn in originals.items():
            setattr(MaskedDiffusionLM, name, wrap(fn))
        try:
            yield
        finally:
            torch.Tensor.tolist = original_tolist  # type: ignore[method-assign]
            for name, fn in originals.items():
                setattr(MaskedDiffusionLM, name, fn)


def in_forward(event: Any) -> bool:
    while event is not None:
        if event.name == FORWARD:
            return True
        event = event.cpu_parent
    return False


class Lines(TorchDispatchMode):
    """Dispatched operations outside the forward by the innermost line of fastdecode that issued them (the
    profiler's own stacks fail to decode on this torch; dispatch sees composite operations as their parts, so its
    total differs a little from the profiler's)."""

    def __init__(self, tolist: Tolist) -> None:
        super().__init__()
        self.tolist, self.by_line = tolist, Counter[str]()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.tolist.depth == 0:
            ours = [f for f in traceback.extract_stack() if "/fastdecode/" in f.filename]
            line = f"{ours[-1].filename.split('fastdecode/')[-1]}:{ours[-1].lineno}" if ours else "?"
            self.by_line[line] += 1
        return func(*args, **(kwargs or {}))


def count(prof: Any, reads: int) -> Count:
    c = Count(syncs=reads)
    for e in prof.events():
        if e.name == FORWARD:
            c.forwards += 1
        if not e.name.startswith("aten::"):
            continue
        if in_forward(e):
            c.forward_ops += 1
            continue
        c.ops += 1
        c.syncs += e.name in SYNCS
        c.uploads += e.name == "aten::lift_fresh"
    return c


def measure(model: Any, method: str, new_tokens: int, prompt: str) -> tuple[list[Count], list[int]]:
    """One generation of `method`, profiled step by step -> (the steps' counts, the output's token ids)."""
    counter, steps = Tolist(), []
    with counter.patched():
        events = fastdecode.stream(model, prompt, method, max_new_tokens=new_tokens)
        while True:
            before = counter.calls
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                event = next(events)
            if not isinstance(event, StepEvent):
                return steps, list(event.results[0].token_ids)
            steps.append(count(prof, counter.calls - before))


def by_line(model: Any, method: str, new_tokens: int, prompt: str) -> Counter[str]:
    """One more generation of `method`, its operations outside the forward counted by line."""
    counter = Tolist()
    with counter.patched(), Lines(counter) as lines:
        for _ in fastdecode.stream(model, prompt, method, max_new_tokens=new_tokens):
            pass
    return lines.by_line


def git_commit() -> str:
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    return out.stdout.strip() or "?"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="zoo:dlm-small")
    ap.add_argument("--method", nargs="+", default=list(METHODS))
    ap.add_argument("--new-tokens", type=int, default=64, help="max_new_tokens (the canvas)")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="float32", help="the model's dtype (bfloat16 adds the casts around its norms)")
    ap.add_argument("--fused", action="store_true", help="the fused kernels (torch.compile's inductor; compiled by a "
                    "first generation outside the counts): what `load` turns on with CUDA graphs on a GPU")
    ap.add_argument("--steps", action="store_true", help="print every step's row, not only the mean")
    ap.add_argument("--lines", type=int, default=0, help="print the N lines of fastdecode with the most ops")
    ap.add_argument("--jsonl", type=Path, help="append one row per method to this file")
    ap.add_argument("--state", default="", help="a label for the rows written with --jsonl (e.g. before / after)")
    ap.add_argument("--commit", help="the commit measured, for the rows (default: this checkout's HEAD)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = fastdecode.load(args.model, device="cpu", dtype=args.dtype, fused=args.fused)
    if args.fused:
        for method in args.method:  # each shape's kernels compiled before the counts
            fastdecode.generate(model, args.prompt, method, max_new_tokens=args.new_tokens)
        if not model.fused:
            raise SystemExit("the fused kernels could not be built here (see the warning); drop --fused")
    rows = []
    print(f"{'method':<15}{'steps':>6}{'ops/step':>10}{'syncs/step':>11}{'uploads/step':>13}{'fwd ops/step':>13}"
          f"{'first step ops':>15}")
    for method in args.method:
        steps, ids = measure(model, method, args.new_tokens, args.prompt)
        n = len(steps)
        if args.steps:
            for i, s in enumerate(steps):
                print(f"  step {i:3d}: {s.ops} ops, {s.syncs} syncs, {s.uploads} uploads, {s.forwards} forward(s) "
                      f"of {s.forward_ops} ops")
        mean = {k: sum(getattr(s, k) for s in steps) / n for k in ("ops", "syncs", "uploads", "forward_ops")}
        print(f"{method:<15}{n:>6}{mean['ops']:>10.1f}{mean['syncs']:>11.1f}{mean['uploads']:>13.1f}"
              f"{mean['forward_ops']:>13.1f}{steps[0].ops:>15}")
        if args.lines:
            for line, k in by_line(model, method, args.new_tokens, args.prompt).most_common(args.lines):
                print(f"    {k / n:7.1f}  {line}")
        rows.append({"method": method, "model": args.model, "new_tokens": args.new_tokens, "threads": args.threads,
                     "dtype": args.dtype, "fused": args.fused,
                     "state": args.state, "commit": args.commit or git_commit(), "steps": n,
                     "ops_per_step": round(mean["ops"], 1), "syncs_per_step": round(mean["syncs"], 2),
                     "uploads_per_step": round(mean["uploads"], 2),
                     "forward_ops_per_step": round(mean["forward_ops"], 1), "first_step_ops": steps[0].ops,
                     "tokens_sha1": hashlib.sha1(json.dumps(ids).encode()).hexdigest()[:12],
                     "torch": torch.__version__})
    if args.jsonl:
        args.jsonl.parent.mkdir(parents=True, exist_ok=True)
        with args.jsonl.open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
