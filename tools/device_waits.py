"""How often a step makes the host wait for a GPU (issue #30: "a speculative loop with at most one host synchronisation
per step"; docs/gpu.md, "One read a step"), counted on this CPU: the simulated device of tests/device_sim.py sees
every read of a device value (`.item()`, `.tolist()`, a copy to the host, an operation sized by the values), each of
which waits for a GPU. zoo:ar-small runs on it in bfloat16, exact mode (width 32) and the capture-free graphs
(`graphs="replay"`): a GPU's default setting, whose verification splits a wide block into chunks and confirms a tree
path off its first branch with one more forward. Per method and temperature, one JSONL row: the reads per target
forward of a generation of `--long` new tokens less one of `--short` on the code suite's first prompt (so the
prefill and the first steps cancel out), by kind; `--rows N` runs the prompt N times in one batch. The drafts:
zoo:ar-tiny for the methods that take a causal draft model, zoo:dlm-small for `spec.dlm_draft`; the heads shipped
beside zoo:ar-small.

Uses only `fastdecode.load` and `fastdecode.generate`, so it also counts an older checkout's package
(`PYTHONPATH=CHECKOUT python tools/device_waits.py --label before --commit C`; the simulation is always this
checkout's).

    python tools/device_waits.py --label after --out docs/results/exact/device-waits.jsonl
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "tests"))  # device_sim (after PYTHONPATH, which may name an older package)
sys.path.append(str(ROOT))

import device_sim  # noqa: E402
import torch  # noqa: E402

device_sim.install()

import fastdecode  # noqa: E402
from fastdecode.bench.harness import Entry  # noqa: E402
from fastdecode.bench.suites import get_suite  # noqa: E402
from fastdecode.bench.tasks import format_prompt  # noqa: E402
from fastdecode.speculative.memory import DrafterMemory  # noqa: E402

METHODS = ["ar.greedy", "spec.pld", "spec.ngram", "spec.suffix", "spec.suffix:tree=true", "spec.recycling",
           "spec.lookahead", "spec.jacobi", "spec.sjd", "spec.layerskip", "spec.layerskip:confidence_stop=0",
           "spec.sparse_self", "spec.draft_model", "spec.rsd", "spec.dyntree", "spec.medusa",
           "spec.medusa:hydra=true", "spec.eagle3", "spec.eagle3:tree=true", "spec.dflash", "spec.dlm_draft"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSONL file the rows are appended to")
    ap.add_argument("--label", default="now", help="what the rows are of (e.g. before / after)")
    ap.add_argument("--commit", default=None, help="the package's commit (default: git's, where it is a checkout)")
    ap.add_argument("--methods", nargs="+", default=METHODS)
    ap.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 1.0])
    ap.add_argument("--short", type=int, default=8)
    ap.add_argument("--long", type=int, default=40)
    ap.add_argument("--rows", type=int, default=1, help="the prompt this many times in one batch (a forward serves "
                    "them all: reads per forward are then per step of the batch)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    setting = dict(device="cpu:0", dtype="bfloat16", exact=32, graphs="replay")
    model = fastdecode.load("zoo:ar-small", **setting)
    kinds = {m.draft_kind for m in map(fastdecode.get_method, (Entry.parse(e).method for e in args.methods))
             if m.needs_draft}
    zoo = {"causal": ("zoo:ar-tiny", setting), "diffusion": ("zoo:dlm-small", {"device": "cpu:0", "dtype": "bfloat16"})}
    drafts = {kind: fastdecode.load(draft, **how) for kind, (draft, how) in zoo.items() if kind in kinds}
    task, seed, _ = get_suite("code").plan()[0]
    prompt = format_prompt(task.items(seed, 1)[0].prompt)
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(fastdecode.__file__).parent).stdout.strip() or None
    command = " ".join(["python", "tools/device_waits.py", *sys.argv[1:]])
    with open(args.out, "a") as out:
        for temperature in args.temperatures:
            for method in args.methods:
                entry = Entry.parse(method)
                name = "ar.sample" if temperature and entry.method == "ar.greedy" else entry.method
                spec = fastdecode.get_method(name)
                kw = {**entry.own, **({"draft": drafts[spec.draft_kind]} if spec.needs_draft else {}),
                      **({"temperature": temperature, "seed": 0} if temperature else {})}

                def run(new: int, name: str = name, kw: dict = kw) -> list:
                    return fastdecode.generate(model, [prompt] * args.rows, name, max_new_tokens=new,
                                               memory=DrafterMemory(), **kw)

                run(args.short)  # a warm-up: the captures, the compilations
                per, forwards, _ = device_sim.reads_per_forward(run, args.short, args.long)
                per = {k: round(v, 2) for k, v in per.items()}
                waits = per.pop("waits")
                row = {"label": args.label, "method": name if name != entry.method else method,
                       "temperature": temperature, "forwards": forwards, "waits_per_forward": waits,
                       "by_kind": per, "rows": args.rows, "commit": commit, "command": command,
                       "model": "zoo:ar-small", "setting": {k: str(v) for k, v in setting.items()}}
                out.write(json.dumps(row) + "\n")
                out.flush()
                print(f"{args.label:7s} t={temperature:<4} {row['method']:34s} forwards {forwards:3d}  "
                      f"waits/forward {waits:6.2f}  {per}", flush=True)

if __name__ == "__main__":
    main()
