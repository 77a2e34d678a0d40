"""The short calibration of sparse.duo, sparse.lychee and sparse.double, saved beside a model as JSON.

A few dense prefills over prompts the caller gives (`calibrate(model, prompts)`) record, per layer and key/value
head, from the last `tail` queries of each prompt (the question, which must find its answer far back):

- `far_mass[layer][head]`: the attention weight that falls outside the first 4 and the last 64 columns, averaged.
  A training-free proxy of our own: heads whose question queries look far back are taken as retrieval heads, the
  rest as streaming heads. (kvpress's experimental on-the-fly DuoAttention scoring is another proxy: the mean query
  and key of BookSum text, RoPE-rotated over 500 positions, scored by the area under the last query's cumulated
  attention curve.) It is what LycheeDecode's retrieval heads are
  chosen by here (its HardKuma gates are trained, with no code released), and what `sparse.duo` falls back to on a
  model without DuoAttention gates (the authors optimise a gate per head: `fastdecode train duo`). On zoo:ar-long it
  separates heads weakly (0.58-0.96 for every head).
- `channels[layer][head]`: key channels by mean |q_d * k_d| over every token of the prompts, the query and key of the
  same token (Double Sparsity's offline "qk" calibration), averaged over a key/value head's query heads, most
  important first.

The file a model ships is made from the `longctx` suite's training items by the benchmark side
(`python -m fastdecode.bench.calibration MODEL_FOLDER`): the prompts are the caller's, so this family never imports
the benchmark. `calibration(model)` reads `sparse_calibration.json` from the model's folder when it is there (the
zoo's ar-long ships one) and otherwise calibrates in memory once per loaded model, on pass-key haystacks of its own
(`haystack_prompts`); `save(...)` writes the file.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .base import Selector, SparseConfig

FILE = "sparse_calibration.json"
SINKS, RECENT = 4, 64
# (name, text) of each calibration prompt: the names are recorded, the texts tokenised and prefilled
Prompts = Sequence[tuple[str, str]]
# the filler of `haystack_prompts`: plain sentences that say nothing about the key
_FILLER = "A quiet river runs past the old mill. Leaves fall in the yard. The train leaves at noon. Rain comes later. "


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
        self.far[layer] = self.far.get(layer, 0) + far
        self.chan[layer] = self.chan.get(layer, 0) + channel_weight(q, k)
        return None


def channel_weight(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """`[Hkv, D]` mean |q_d * k_d| over the forward's tokens, each query with its own token's key (the authors'
    "qk" ranking: what a channel adds to a token's logits), averaged over each key/value head's query heads. `q`
    `[B, Hq, Q, D]`, `k` `[B, Hkv, K, D]` whose last Q columns are the queries' own keys."""
    Hkv, Q = k.shape[1], q.shape[2]
    g = q.shape[1] // Hkv
    own = k[:, :, -Q:].repeat_interleave(g, dim=1)  # [B, Hq, Q, D]
    return (q * own).abs().float().mean(dim=(0, 2)).reshape(Hkv, g, -1).mean(1)


def calibrate(model: Any, prompts: Prompts, *, context: int, tail: int = 16,
              source: str = "longctx training items") -> dict:
    """Run one dense prefill per prompt and return the JSON-ready record (`context`: the prompts' intended length
    in tokens, `source`: what they are, both recorded)."""
    rec = _Recorder(tail)
    for _, text in prompts:
        ids = model.tokenizer(text, return_tensors="pt")["input_ids"].to(model.device)
        cache = model.new_cache(capacity=ids.shape[1])
        model.forward(ids, torch.arange(ids.shape[1], device=ids.device)[None], cache, num_logits=1, sparse=rec)
    layers = sorted(rec.far)
    return {
        "about": "fastdecode.sparse.calibration: far attention mass per (layer, kv head) and key channels by "
                 f"importance, from dense prefills of {source}",
        "items": [name for name, _ in prompts], "context": context, "tail": tail, "sinks": SINKS, "recent": RECENT,
        "far_mass": [[round(float(x) / len(prompts), 5) for x in rec.far[layer]] for layer in layers],
        "channels": [rec.chan[layer].argsort(-1, descending=True).tolist() for layer in layers],
    }


def haystack_prompts(model: Any, items: int = 4, context: int = 1024, seed: int = 0) -> list[tuple[str, str]]:
    """`items` pass-key prompts of about `context` tokens of `model`'s tokenizer: filler with a 5-digit key at a
    random depth, then the question (what a model without a calibration file is calibrated on)."""
    rng = random.Random(seed)
    unit = max(1, len(model.tokenizer(_FILLER)["input_ids"]))
    units = max(1, context // unit)
    prompts = []
    for _ in range(items):
        key, depth = rng.randint(10_000, 99_999), rng.randint(0, units)
        text = _FILLER * depth + f"The pass key is {key}. Remember it. " + _FILLER * (units - depth)
        prompts.append(("passkey", text + "What is the pass key? The pass key is"))
    return prompts


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
        record = calibrate(model, haystack_prompts(model), context=1024, source="pass-key haystacks")
    model._sparse_calibration = record
    return record
