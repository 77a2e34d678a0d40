"""Count the torch operations a decode step runs outside its captured forward (docs/gpu.md, "Measured on an NVIDIA
H200"): the host work that CUDA graphs do not remove. Runs `ar.greedy` steps of a model in exact mode with the
capture-free graphs (`graphs="replay"`) on the CPU, counting every dispatched operation except those of the graph's
body, and prints the mean per step with the line of fastdecode that issued each.

    python tools/host_ops.py --model zoo:ar-small --steps 10
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import fastdecode  # noqa: E402
from fastdecode.ar.driver import ARSession  # noqa: E402
from fastdecode.ar.greedy import GreedyConfig  # noqa: E402
from fastdecode.models import graphs  # noqa: E402


class _Count(TorchDispatchMode):
    """Every dispatched operation while `on`, by the fastdecode line that issued it."""

    def __init__(self) -> None:
        super().__init__()
        self.by_line: Counter[str] = Counter()
        self.on = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.on:
            ours = [f for f in traceback.extract_stack() if "/fastdecode/" in f.filename]
            self.by_line[(f"{ours[-1].filename.split('fastdecode/')[-1]}:{ours[-1].lineno}" if ours else "?") + f" {func}"] += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="zoo:ar-small")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--width", type=int, default=32, help="exact mode's width")
    args = ap.parse_args()
    model = fastdecode.load(args.model, device="cpu", dtype="bfloat16", exact=args.width, graphs="replay")
    if not isinstance(model, fastdecode.CausalLM):
        raise SystemExit(f"{args.model} is not a causal LM: the count is of ar.greedy's decode steps")
    count = _Count()
    replay = graphs.Graphs._replay

    def uncounted(self, entry, cache):  # the graph's body is one launch on a GPU: not host work
        count.on = False
        try:
            return replay(self, entry, cache)
        finally:
            count.on = True

    graphs.Graphs._replay = uncounted  # type: ignore[method-assign]
    session = ARSession(model, GreedyConfig(max_new_tokens=args.steps + 8), slots=1)
    session.join(model.tokenizer("def add(a, b):\n", return_tensors="pt").input_ids)
    for _ in range(3):  # prefill, capture, first replay
        session.step()
    with count:
        for _ in range(args.steps):
            session.step()
    print(f"{sum(count.by_line.values()) / args.steps:.1f} operations per step outside the captured forward")
    for line, n in count.by_line.most_common():
        print(f"{n / args.steps:6.1f}  {line}")


if __name__ == "__main__":
    main()
