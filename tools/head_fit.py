"""Can a shipped head fit what it is asked? Train a copy on ONE batch of self-distilled training items and watch its
top-1 agreement there and on a held-out batch: memorising the one while the other stays flat means the head lacks the
information (the context), not optimisation. Usage (zoo:ar-small, its cached self-distilled data):
    python tools/head_fit.py --kind medusa --steps 200
"""

from __future__ import annotations

import argparse

import torch

import fastdecode
from fastdecode.heads import load_head
from fastdecode.train.heads import length_batches, target_batch
from fastdecode.train.objectives import head_objective
from fastdecode.train.selfdata import self_distilled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="medusa")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = fastdecode.load("zoo:ar-small", device="cpu", dtype="float32")
    data = self_distilled(model)  # the loop's defaults: 4,000 items, the last 200 held out
    train, held = data[:-200], data[-200:]
    groups = length_batches(train, 2048)
    one = target_batch(model, [train[i] for i in groups[len(groups) // 3]], ())
    other = target_batch(model, [held[i] for i in length_batches(held, 2048)[2]], ())
    goal = head_objective(args.kind)
    head = load_head(f"zoo:ar-small/{args.kind}", dtype=torch.float32).train()
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr)
    for step in range(args.steps + 1):
        loss, metrics = goal.head_loss(head, model, one, torch.Generator())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            with torch.no_grad():
                _, seen = goal.head_loss(head, model, other, torch.Generator())
            print(f"step {step}: the batch {({k: round(v, 2) for k, v in metrics.items()})}, "
                  f"held out {({k: round(v, 2) for k, v in seen.items()})}")


if __name__ == "__main__":
    main()
