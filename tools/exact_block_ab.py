"""Exact mode's key block, old (2048 columns) against new (256), on one machine in one run: `ar.greedy` on
zoo:ar-small in bfloat16, the code suite, alternating the two settings `--reps` times (the first with a warm-up).
Rows carry `params.block` and `params.rep`; the tokens of the two settings are compared item by item.

    python tools/exact_block_ab.py --out docs/results/exact/block-ab.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import fastdecode  # noqa: E402
from fastdecode.bench.harness import run_bench  # noqa: E402
from fastdecode.models.exact import Exact  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="the JSONL file to write (replaced)")
    ap.add_argument("--limit", type=int, default=5, help="items (default 5)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--blocks", type=int, nargs="+", default=[2048, 256])
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    args.out.unlink(missing_ok=True)
    tokens: dict[int, dict[str, list[int]]] = {}
    for rep in range(args.reps):
        for block in args.blocks:
            model = fastdecode.load("zoo:ar-small", device="cpu", dtype="bfloat16", exact=Exact(32, block))
            with tempfile.TemporaryDirectory() as tmp:
                run_bench("code", model, ["ar.greedy"], Path(tmp) / "rows.jsonl", limit=args.limit,
                          warmup=rep == 0)
                rows = [json.loads(line) for line in open(Path(tmp) / "rows.jsonl")]
            with args.out.open("a") as f:
                for row in rows:
                    row["params"] = {**row.get("params", {}), "block": block, "rep": rep}
                    f.write(json.dumps(row) + "\n")
                    tokens.setdefault(block, {})[str(row["item"])] = row["token_ids"]
            rate = sum(r["new_tokens"] for r in rows) / sum(r["wall_s"] for r in rows)
            print(f"block {block} rep {rep}: {rate:.2f} tokens/s", flush=True)
    first, *others = args.blocks
    for block in others:
        same = sum(tokens[block][k] == v for k, v in tokens[first].items())
        print(f"block {block}: tokens equal to block {first}'s on {same}/{len(tokens[first])} items")


if __name__ == "__main__":
    main()
