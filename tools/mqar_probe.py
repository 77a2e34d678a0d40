"""A short MQAR-only run of zoo:ar-long's recall shape (fastdecode/train/recall.py), for trial H's probes: does the
lookup circuit form at this setting, and how fast does the loss leave guessing? One JSONL row per 25 steps (mean
loss over them) and a last row with the MQAR accuracy at `--pairs` pairs, `--pairs // 2` queries.

    python tools/mqar_probe.py --tie --pool 128 --min-pairs 4 --pairs 16 --steps 200 --out probes.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoTokenizer

from fastdecode.train import recall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tie", action="store_true", help="tied input and output embeddings")
    ap.add_argument("--pool", type=int, default=128)
    ap.add_argument("--min-pairs", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="JSONL file, appended to")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(str(Path(recall.__file__).parents[1] / "zoo" / "ar-small"))
    model = recall.new_model(tokenizer, recall.Shape(tie=args.tie), args.seed)
    # the stage name seeds the rows: "p", the name trial H's probes ran under
    stage = recall.RecallStage("p", steps=args.steps, lr=args.lr, tasks="mqar", batch=32, pairs=args.pairs,
                               min_pairs=args.min_pairs, queries=args.pairs // 2, pool=args.pool)
    setting = {"tied": args.tie, "pool": args.pool, "pairs": [args.min_pairs, args.pairs], "steps_total": args.steps,
               "lr": args.lr, "seed": args.seed}
    losses: list[float] = []
    with open(args.out, "a") as f:
        def on_step(row: dict) -> None:
            losses.append(row["loss"])
            if len(losses) % 25 == 0:
                mean = round(sum(losses[-25:]) / 25, 3)
                f.write(json.dumps({**setting, "step": len(losses), "mean_loss_last25": mean,
                                    "elapsed_s": row["elapsed_s"]}) + "\n")
                f.flush()

        recall.train_stage(model, tokenizer, stage, args.seed, Path(args.out).parent, on_step=on_step)
        acc = recall.mqar_accuracy(model, tokenizer, args.pairs, args.pairs // 2, 64, args.pool)
        f.write(json.dumps({**setting, "mqar_accuracy": acc}) + "\n")


if __name__ == "__main__":
    main()
