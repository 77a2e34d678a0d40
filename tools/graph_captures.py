"""Count the CUDA graph captures of spec.eagle3's drafting, generation by generation, in one process (docs/gpu.md,
"EAGLE-3's graphs across generations"): on the simulated device of tests/device_sim.py, with the drafter's capture
emulated (`Eagle3Drafter.captures = True`: the body recorded and run again at each replay), the chain and the tree
on a few code prompts. Prints, per generation, its captures, replays, the head cache's storage version (1: made once,
never grown) and its new tokens.

    python tools/graph_captures.py --new 128
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent.parent))  # after PYTHONPATH, which may name an older package
sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))
import device_sim  # noqa: E402

device_sim.install()  # (before fastdecode loads: the simulation patches torch)

import fastdecode  # noqa: E402
from fastdecode.speculative import step_graph  # noqa: E402
from fastdecode.speculative.drafters.eagle3 import Eagle3Drafter  # noqa: E402

PROMPTS = ["def add(a, b):", "def reverse(xs):\n    ", "Sort this list: 5 3 9 1",
           "class Stack:\n    def push(self, x):", "def fib(n):\n    if n < 2:",
           "# sum the squares of a list\ndef sq(xs):"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="zoo:ar-small")
    ap.add_argument("--new", type=int, default=128, help="new tokens a generation")
    args = ap.parse_args()
    made: list[Any] = []  # each drafter's StepGraphs (not the drafter: it must die to give its cache back)
    caches: list[Any] = []  # each drafter's head cache, once made or taken
    original, enter = Eagle3Drafter.__init__, Eagle3Drafter._enter

    def init(self: Any, *a: Any, **k: Any) -> None:
        original(self, *a, **k)
        made.append(self.graphs)

    def entered(self: Any, context: Any) -> None:
        enter(self, context)
        if len(caches) < len(made):
            caches.append(self.cache)

    Eagle3Drafter.__init__ = init  # type: ignore[method-assign]
    Eagle3Drafter._enter = entered  # type: ignore[method-assign]
    Eagle3Drafter.captures = True
    step_graph.capture = device_sim.emulated_capture
    model = fastdecode.load(args.model, device="cpu:0", dtype="bfloat16")
    for params in ({}, {"tree": True}):
        made.clear()
        caches.clear()
        tokens = [fastdecode.generate(model, p, "spec.eagle3", max_new_tokens=args.new, graph=True,
                                      **params).stats.new_tokens for p in PROMPTS]
        print(f"spec.eagle3{':tree=true' if params else ''}: captures {[g.stats['captures'] for g in made]} "
              f"(total {sum(g.stats['captures'] for g in made)}), replays {[g.stats['replays'] for g in made]}, "
              f"storage versions {[c.version for c in caches]}, new tokens {tokens}")


if __name__ == "__main__":
    main()
