"""Count the torch operations a decode step runs outside its captured forward (docs/gpu.md, "Measured on an NVIDIA
H200"): the host work that CUDA graphs do not remove. Runs `ar.greedy` steps of a model in exact mode with the
capture-free graphs (`graphs="replay"`) on the CPU, counting every dispatched operation except those of the graph's
body (`fastdecode.models.host_ops.HostOps`), and prints the mean per step, the device-to-host reads per step, and the
line of fastdecode and the operation of each.

    python tools/host_ops.py --model zoo:ar-small --steps 10
    python tools/host_ops.py --model zoo:ar-small --spec spec.suffix spec.draft_model --draft zoo:ar-tiny

`--spec` counts speculative methods instead (entries as the bench writes them, `method:name=value`): a generation of
40 new tokens less one of 8 on the same prompt (so the prefill, the eager first forward and the capture cancel out),
per target forward between them, with the draft forwards; `.tolist()` of a CPU tensor counts as a read (on the CPU a
read cannot be told from host work), so the reads are an upper bound of what a GPU would synchronise on.
`--simulated` runs them on the simulated device of tests/device_sim.py (a GPU's code paths: the drafts left on the
device, no early stop of a best-first tree) instead of the CPU:

    python tools/host_ops.py --simulated --spec spec.dyntree spec.dyntree:early_stop=true spec.medusa
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent))  # after PYTHONPATH, which may name an older package

if "--simulated" in sys.argv:  # before torch and fastdecode load: the simulation patches torch
    sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))
    import device_sim

    device_sim.install()

import fastdecode  # noqa: E402
from fastdecode.ar.driver import ARSession  # noqa: E402
from fastdecode.ar.greedy import GreedyConfig  # noqa: E402
from fastdecode.bench.harness import Entry  # noqa: E402
from fastdecode.models.host_ops import HostOps  # noqa: E402
from fastdecode.speculative.model_chain import ModelChainDrafter  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="zoo:ar-small")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--width", type=int, default=32, help="exact mode's width")
    ap.add_argument("--spec", nargs="+", default=[], help="speculative methods to count instead of ar.greedy steps")
    ap.add_argument("--draft", default="zoo:ar-tiny", help="the draft model of spec.draft_model")
    ap.add_argument("--simulated", action="store_true", help="run on the simulated device (tests/device_sim.py)")
    args = ap.parse_args()
    args.device = "cpu:0" if args.simulated else "cpu"
    model = fastdecode.load(args.model, device=args.device, dtype="bfloat16", exact=args.width, graphs="replay")
    if not isinstance(model, fastdecode.CausalLM):
        raise SystemExit(f"{args.model} is not a causal LM: the count is of ar.greedy's decode steps")
    if args.spec:
        return spec(model, args)
    session = ARSession(model, GreedyConfig(max_new_tokens=args.steps + 8), slots=1)
    session.join(model.tokenizer("def add(a, b):\n", return_tensors="pt").input_ids)
    for _ in range(3):  # prefill, capture, first replay
        session.step()
    with HostOps() as count:
        for _ in range(args.steps):
            session.step()
    print(f"{count.ops / args.steps:.1f} operations per step outside the captured forward "
          f"({count.launches / args.steps:.1f} of them launches), {count.reads / args.steps:.1f} device-to-host "
          f"reads per step")
    for line, n in count.by_line.most_common():
        print(f"{n / args.steps:6.1f}  {line}")


def spec(model: fastdecode.CausalLM, args: argparse.Namespace) -> None:
    """Operations and reads per target forward of whole generations of `args.spec`; a draft model's chain both ways
    (`read_each_token`: True is the CPU's per-token stop, False the GPU's single read)."""
    draft = fastdecode.load(args.draft, device=args.device, dtype="bfloat16", exact=args.width, graphs="replay")
    prompt = "def fib(n):\n"
    for text in args.spec:
        entry = Entry.parse(text)
        method = entry.method
        kw = {**entry.own, **({"draft": draft} if fastdecode.get_method(method).needs_draft else {})}
        if method == "spec.draft_model":
            kw.setdefault("num_draft_tokens", 4)
        for each in (True, False) if method == "spec.draft_model" and not args.simulated else (None,):
            ModelChainDrafter.read_each_token = each
            # once first, uncounted: the graphs a generation captures are kept for the next (cache/pool.py), so
            # without it the shorter run alone would pay the capture
            fastdecode.generate(model, prompt, method, max_new_tokens=40, **kw)
            runs = []
            for new_tokens in (8, 40):  # the same prefix: the difference is 32 tokens' steps, without the prefill
                with HostOps() as count:
                    out = fastdecode.generate(model, prompt, method, max_new_tokens=new_tokens, **kw)
                runs.append((count.ops, count.launches, count.reads, out.stats.forwards, out.stats.draft_forwards))
            (ops8, l8, reads8, f8, d8), (ops40, l40, reads40, f40, d40) = runs
            f = f40 - f8
            name = text if each is None else f"{text} (read_each_token={each})"
            print(f"{name}: {f} target forwards, {(ops40 - ops8) / f:.1f} operations ({(l40 - l8) / f:.1f} of them "
                  f"launches) and {(reads40 - reads8) / f:.2f} reads per forward outside the captured forwards, "
                  f"{(d40 - d8) / f:.2f} draft forwards")
    ModelChainDrafter.read_each_token = None


if __name__ == "__main__":
    main()
