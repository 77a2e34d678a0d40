"""The short calibration of sparse.duo, sparse.lychee and sparse.double, saved beside a model as JSON.

One dense prefill over a few training items of the `longctx` tasks (train seeds) records, per layer and key/value
head, from the last `tail` queries of each prompt (the question, which must find its answer far back):

- `far_mass[layer][head]`: the attention weight that falls outside the first 4 and the last 64 columns, averaged.
  DuoAttention learns a gate per head by distillation (hours on GPUs); this is the cheap stand-in kvpress uses when
  no trained pattern exists (scoring heads on the fly): heads that look far are retrieval heads, the rest
  streaming heads. LycheeDecode's retrieval heads are chosen the same way here (its HardKuma gates are trained).
- `channels[layer][head]`: key channels by mean |q_d| * mean |k_d| (Double Sparsity's offline "qk" channel
  calibration), most important first.

`calibration(model)` reads `sparse_calibration.json` from the model's folder when it is there (the zoo's ar-long
ships one) and otherwise calibrates in memory once per loaded model; `save(...)` writes the file.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch

from ..bench.tasks import format_prompt
from ..bench.tasks.longctx import OPS
from .base import Selector, SparseConfig

FILE = "sparse_calibration.json"
SINKS, RECENT = 4, 64


class _Recorder(Selector):
    """Reads every layer's queries and keys of a dense prefill; selects nothing."""

    def __init__(self, tail: int) -> None:
        super().__init__(SparseConfig())
        self.tail = tail
        self.far: dict[int, torch.Tensor] = {}
        self.chan: dict[int, torch.Tensor] = {}

    def select(self, layer, q, k, v, mask):
        Hkv = k.shape[1]
        g = q.shape[1] // Hkv
        qt = q[:, :, -self.tail:]  # [B, Hq, T, D]
        s = torch.matmul(qt, k.repeat_interleave(g, dim=1).transpose(-1, -2)) / q.shape[-1] ** 0.5
        allow = mask[:, :, -self.tail:]  # [B, 1, T, K]
        p = s.masked_fill(~allow, float("-inf")).softmax(-1)
        K = k.shape[2]
        cols = torch.arange(K, device=k.device)
        rows = torch.arange(K - qt.shape[2], K, device=k.device)
        near = (cols[None] < SINKS) | (cols[None] > rows[:, None] - RECENT)  # [T, K]
        far = (p * ~near).sum(-1).mean(dim=(0, 2))  # [Hq]
        far = far.reshape(Hkv, g).mean(1)
        qa = qt.abs().mean(dim=(0, 2)).reshape(Hkv, g, -1).mean(1)  # [Hkv, D]
        ka = k.abs().mean(dim=(0, 2))  # [Hkv, D]
        self.far[layer] = self.far.get(layer, 0) + far
        self.chan[layer] = self.chan.get(layer, 0) + qa * ka
        return None


def calibrate(model: Any, items: int = 4, context: int = 1024, tail: int = 16, seed: int = 0) -> dict:
    """Run the calibration prefills (training items only) and return the JSON-ready record."""
    rng = random.Random(seed)
    rec = _Recorder(tail)
    names = []
    for i in range(items):
        task = OPS[i % len(OPS)]("1k")
        task.context = context
        item = task.make_item(random.Random(rng.randrange(1_000_000)))  # train seeds
        names.append(task.op)
        ids = model.tokenizer(format_prompt(item.prompt), return_tensors="pt")["input_ids"].to(model.device)
        cache = model.new_cache(capacity=ids.shape[1])
        model.forward(ids, torch.arange(ids.shape[1], device=ids.device)[None], cache, num_logits=1, sparse=rec)
    layers = sorted(rec.far)
    return {
        "about": "fastdecode.sparse.calibration: far attention mass per (layer, kv head) and key channels by "
                 "importance, from dense prefills of longctx training items",
        "items": names, "context": context, "tail": tail, "sinks": SINKS, "recent": RECENT,
        "far_mass": [[round(float(x) / items, 5) for x in rec.far[layer]] for layer in layers],
        "channels": [rec.chan[layer].argsort(-1, descending=True).tolist() for layer in layers],
    }


def save(record: dict, folder: str | Path) -> Path:
    path = Path(folder) / FILE
    path.write_text(json.dumps(record) + "\n")
    return path


def calibration(model: Any) -> dict:
    """The model's calibration: its folder's file, else one computed now (kept on the model object)."""
    known = getattr(model, "_sparse_calibration", None)
    if known is not None:
        return known
    record = None
    try:
        from ..models.loading import resolve

        path = resolve(model.name) / FILE
        if path.is_file():
            record = json.loads(path.read_text())
    except Exception:  # a model without a folder (built in memory): calibrate it
        record = None
    if record is None or len(record["far_mass"]) != getattr(model.config, "num_hidden_layers", -1):
        record = calibrate(model)
    model._sparse_calibration = record
    return record


def main(argv: list[str] | None = None) -> None:
    """`python -m fastdecode.sparse.calibration MODEL_FOLDER`: calibrate and write the file beside the weights."""
    import argparse

    from ..models.loading import load, resolve

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("model", help="a model folder or zoo:NAME")
    ap.add_argument("--out", default=None, help="folder to write sparse_calibration.json to (default: the model's)")
    ap.add_argument("--items", type=int, default=4)
    ap.add_argument("--context", type=int, default=1024)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model = load(args.model)
    save(calibrate(model, items=args.items, context=args.context), args.out or resolve(args.model))


if __name__ == "__main__":
    main()
