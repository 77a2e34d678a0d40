"""What exact mode costs (docs/gpu.md): tokens/s of methods with exact mode off and at each `--widths`, in one
process, the configurations taking turns item by item so that a slow spell of a shared machine falls on all of them;
each row also says whether the method's tokens equal `ar.greedy`'s at the same setting.

    python tools/exact_cost.py --model zoo:ar-small --dtype bfloat16 --widths 0 8 32 --limit 2 \
        --methods ar.greedy spec.suffix spec.pld --out docs/results/exact/cost-cpu.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import fastdecode  # noqa: E402
from fastdecode.bench.jobs import machine, versions  # noqa: E402
from fastdecode.bench.suites import get_suite  # noqa: E402
from fastdecode.bench.tasks import format_prompt  # noqa: E402
from fastdecode.models.exact import Exact  # noqa: E402
from fastdecode.speculative.memory import DrafterMemory  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="zoo:ar-small")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default=None)
    ap.add_argument("--widths", nargs="+", type=int, default=[0, 8, 32], help="0: exact mode off")
    ap.add_argument("--suite", default="code")
    ap.add_argument("--limit", type=int, default=2, help="items per task")
    ap.add_argument("--methods", nargs="+", default=["ar.greedy", "spec.suffix", "spec.pld"])
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    base = fastdecode.load(args.model, device=args.device, dtype=args.dtype, exact=False)
    # one module, one adapter per setting: the weights are shared, only the forward's shapes differ
    models = {w: fastdecode.CausalLM(base.model, base.tokenizer, base.name, exact=Exact(w) if w else None)
              for w in args.widths}
    items = [item for task, seed, n in get_suite(args.suite).plan(limit=args.limit) for item in task.items(seed, n)]
    prompts = [format_prompt(item.prompt) for item in items]
    totals = {(w, m): [0.0, 0, 0] for w in args.widths for m in args.methods}  # seconds, tokens, equal items
    for model in models.values():  # warm-up
        fastdecode.generate(model, prompts[0], args.methods[0], max_new_tokens=4)
    for prompt in prompts:
        for w, model in models.items():
            ref = None
            for method in args.methods:
                start = time.perf_counter()
                r = fastdecode.generate(model, prompt, method, max_new_tokens=args.max_new_tokens,
                                        memory=DrafterMemory())
                totals[(w, method)][0] += time.perf_counter() - start
                totals[(w, method)][1] += r.stats.new_tokens
                ref = r.token_ids if method == "ar.greedy" else ref
                totals[(w, method)][2] += int(ref is not None and r.token_ids == ref)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python", "tools/exact_cost.py", *sys.argv[1:]])
    with out.open("a") as f:
        for (w, method), (seconds, tokens, equal) in totals.items():
            row = {"model": args.model, "dtype": args.dtype, "exact": w or None, "method": method,
                   "items": len(prompts), "max_new_tokens": args.max_new_tokens, "tokens_per_s": tokens / seconds,
                   "equal_to_ar_greedy": equal, "threads": args.threads, "machine": machine(base.device),
                   "command": command, **versions()}
            f.write(json.dumps(row) + "\n")
            print(json.dumps({k: row[k] for k in ("exact", "method", "tokens_per_s", "equal_to_ar_greedy", "items")}))


if __name__ == "__main__":
    main()
