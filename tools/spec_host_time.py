"""Host time per target forward of a speculative step, outside the captured forward (issue #30: "a speculative step
costing close to a plain step"; docs/gpu.md, "Host work per step"). On a GPU whose graphed forward is the whole
step's device work, the host's time around it (drafting, the verification block, the verdict, the bookkeeping, the
interpreter's garbage collection) is time the device waits, since each step ends in a read of its verdict.

Runs zoo:ar-small in bfloat16, exact mode, with the capture-free graphs (`graphs="replay"`, the CPU's stand-in for
CUDA graphs: the same static buffers and the same operations outside them), one torch thread, and subtracts the time
spent inside the graphs' bodies (`Graphs._replay`, `Graphs._capture`) from each generation's wall time. Two figures
per method, one JSONL row each:

- `steady`: each generation with an empty drafter memory (what a first request meets); a generation of `--short` new
  tokens is subtracted from one of `--long` on the same prompt, so the prefill and the first forward cancel; the sum
  over the code suite's first `--items` prompts divided by the target forwards between the two, the median of
  `--repeats` rounds (methods take turns within a round);
- `stream`: `--stream` rounds of `--long`-token generations over the same prompts on the model's own memory, as a
  server's requests follow each other (spec.suffix's global tree of earlier outputs grows), prefill included: the
  mean host time per target forward, and the full (oldest-generation) collections of Python's garbage collector
  during them with their total pause.

`--no-gc` turns the collector off while timing, which leaves the host work alone.

Uses only `fastdecode.load`, `fastdecode.generate` and `Graphs`, so the same command runs from an older checkout
(`PYTHONPATH=CHECKOUT python tools/spec_host_time.py --label before`).

    python tools/spec_host_time.py --label after --out docs/results/exact/spec-host-cpu.jsonl
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch

import fastdecode
from fastdecode.bench.harness import Entry
from fastdecode.bench.suites import get_suite
from fastdecode.bench.tasks import format_prompt
from fastdecode.models.graphs import Graphs
from fastdecode.speculative.memory import DrafterMemory, forget

METHODS = ["ar.greedy", "spec.pld", "spec.ngram", "spec.suffix", "spec.suffix:tree=true", "spec.lookahead",
           "spec.recycling"]


class Clock:
    """Seconds spent inside the graphs' bodies (`Graphs._replay`, `Graphs._capture`), and the full collections of
    the garbage collector with their pause, while entered."""

    def __init__(self) -> None:
        self.inside = 0.0
        self.full: list[float] = []
        self._gc_start = 0.0
        self._originals = {name: getattr(Graphs, name) for name in ("_replay", "_capture")}

    def __enter__(self) -> Clock:
        for name, original in self._originals.items():
            setattr(Graphs, name, self._timed(original))
        gc.callbacks.append(self._gc)
        return self

    def __exit__(self, *exc: object) -> None:
        for name, original in self._originals.items():
            setattr(Graphs, name, original)
        gc.callbacks.remove(self._gc)

    def _timed(self, original):  # type: ignore[no-untyped-def]
        def run(*args, **kwargs):  # type: ignore[no-untyped-def]
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.inside += time.perf_counter() - start

        return run

    def _gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif info["generation"] == 2:
            self.full.append(time.perf_counter() - self._gc_start)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", required=True, help="what code ran (e.g. before, after)")
    ap.add_argument("--methods", nargs="+", default=METHODS)
    ap.add_argument("--items", type=int, default=4, help="code suite items")
    ap.add_argument("--short", type=int, default=8)
    ap.add_argument("--long", type=int, default=72)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stream", type=int, default=6, help="rounds of the stream figure (0: none)")
    ap.add_argument("--no-gc", action="store_true", help="the garbage collector off while timing (the host work alone)")
    ap.add_argument("--commit", help="the commit measured, where the code is not a git checkout (a `git archive`)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    task, seed, _ = get_suite("code").plan()[0]
    prompts = [format_prompt(item.prompt) for item in task.items(seed, args.items)]
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                           cwd=Path(fastdecode.__file__).parent).stdout.strip() or None
    model = fastdecode.load("zoo:ar-small", device="cpu", dtype="bfloat16", exact=True, graphs="replay")
    with Clock() as clock:
        runs = Runs(model, clock)
        for method in args.methods:  # warm: every graph a generation captures is kept for the next (each length's)
            for prompt in prompts:
                runs.host(method, prompt, args.short, DrafterMemory())
                runs.host(method, prompt, args.long, DrafterMemory())
        if args.no_gc:
            gc.collect()
            gc.disable()
        try:
            rows = runs.steady(args.methods, prompts, args.short, args.long, args.repeats)
            rows += [runs.stream(method, prompts, args.long, args.stream) for method in args.methods if args.stream]
        finally:
            gc.enable()
    for row in rows:
        row = {"label": args.label, "model": "zoo:ar-small", "setting": "bf16-exact-replay", **row,
               "items": args.items, "new_tokens": [args.short, args.long], "threads": 1,
               "gc": "off" if args.no_gc else "on", "commit": commit,
               "fastdecode": str(Path(fastdecode.__file__).parent)}
        print(json.dumps(row))
        if args.out:
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")


class Runs:
    """Generations of one model, each timed as host time: its wall clock less the time inside the graphs' bodies."""

    def __init__(self, model: fastdecode.CausalLM, clock: Clock) -> None:
        self.model, self.clock = model, clock

    def host(self, method: str, prompt: str, new_tokens: int, memory: DrafterMemory | None) -> tuple[float, int]:
        """(host seconds, target forwards) of one generation; `memory` None: the model's own."""
        entry = Entry.parse(method)  # as `fastdecode bench --methods` reads "spec.suffix:tree=true"
        self.clock.inside = 0.0
        start = time.perf_counter()
        out = fastdecode.generate(self.model, prompt, entry.method, max_new_tokens=new_tokens, memory=memory,
                                  **entry.own)
        return time.perf_counter() - start - self.clock.inside, out.stats.forwards

    def steady(self, methods: list[str], prompts: list[str], short: int, long: int, repeats: int) -> list[dict]:
        """The `steady` figure of each method: methods take turns within a round, the median of the rounds."""
        per: dict[str, list[float]] = {m: [] for m in methods}
        forwards: dict[str, int] = {}
        for _ in range(repeats):
            for method in methods:
                seconds, count = 0.0, 0
                for prompt in prompts:
                    h1, f1 = self.host(method, prompt, short, DrafterMemory())
                    h2, f2 = self.host(method, prompt, long, DrafterMemory())
                    seconds, count = seconds + h2 - h1, count + f2 - f1
                per[method].append(seconds / count * 1000)
                forwards[method] = count
        return [{"figure": "steady", "method": m, "target_forwards": forwards[m],
                 "host_ms_per_forward": round(statistics.median(per[m]), 3), "rounds": [round(x, 3) for x in per[m]]}
                for m in methods]

    def stream(self, method: str, prompts: list[str], long: int, rounds: int) -> dict:
        """The `stream` figure: `rounds` passes over the prompts on the model's own memory, from empty."""
        forget(self.model)
        self.clock.full.clear()
        seconds, count = 0.0, 0
        for _ in range(rounds):
            for prompt in prompts:
                h, f = self.host(method, prompt, long, None)
                seconds, count = seconds + h, count + f
        return {"figure": "stream", "method": method, "generations": rounds * len(prompts), "target_forwards": count,
                "host_ms_per_forward": round(seconds / count * 1000, 3), "full_collections": len(self.clock.full),
                "full_collections_ms": round(sum(self.clock.full) * 1000, 1)}


if __name__ == "__main__":
    main()
