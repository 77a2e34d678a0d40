"""Count the torch operations a decode step runs outside its captured forward (docs/gpu.md, "Measured on an NVIDIA
H200"): the host work that CUDA graphs do not remove. Runs `ar.greedy` steps of a model in exact mode with the
capture-free graphs (`graphs="replay"`) on the CPU, counting every dispatched operation except those of the graph's
body (`fastdecode.models.host_ops.HostOps`), and prints the mean per step, the device-to-host reads per step, and the
line of fastdecode and the operation of each.

    python tools/host_ops.py --model zoo:ar-small --steps 10
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fastdecode  # noqa: E402
from fastdecode.ar.driver import ARSession  # noqa: E402
from fastdecode.ar.greedy import GreedyConfig  # noqa: E402
from fastdecode.models.host_ops import HostOps  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="zoo:ar-small")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--width", type=int, default=32, help="exact mode's width")
    args = ap.parse_args()
    model = fastdecode.load(args.model, device="cpu", dtype="bfloat16", exact=args.width, graphs="replay")
    if not isinstance(model, fastdecode.CausalLM):
        raise SystemExit(f"{args.model} is not a causal LM: the count is of ar.greedy's decode steps")
    session = ARSession(model, GreedyConfig(max_new_tokens=args.steps + 8), slots=1)
    session.join(model.tokenizer("def add(a, b):\n", return_tensors="pt").input_ids)
    for _ in range(3):  # prefill, capture, first replay
        session.step()
    with HostOps() as count:
        for _ in range(args.steps):
            session.step()
    print(f"{count.ops / args.steps:.1f} operations per step outside the captured forward, "
          f"{count.reads / args.steps:.1f} device-to-host reads per step")
    for line, n in count.by_line.most_common():
        print(f"{n / args.steps:6.1f}  {line}")


if __name__ == "__main__":
    main()
