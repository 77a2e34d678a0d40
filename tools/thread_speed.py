"""Tokens/s of one generation at 1, 2, ... torch threads, per model: the evidence behind the CLI's default thread
count (`fastdecode.models.threads`). One JSONL row per (model, method, threads, repeat).

A small model's forward is a few small matrix products: splitting each over threads costs more in hand-offs than
it saves, and on a machine whose cores are busy with other work a second thread waits for a core. The thread
counts take turns within each repeat, so that a slow spell of a shared machine falls on all of them. Besides the
zoo models, `--synthetic N` adds a randomly initialised Llama-style model of about N million parameters (token-id
prompts, the same number of steps), to see where more threads start to pay.

    python tools/thread_speed.py --models zoo:ar-tiny zoo:ar-small zoo:dlm-small --threads 1 2 --reps 5 \
        --out docs/results/engine/threads.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import fastdecode  # noqa: E402
from fastdecode.bench.jobs import machine  # noqa: E402
from fastdecode.models.causal import CausalLM  # noqa: E402

PROMPT = "Q: Reverse this list: [I, J, Z, Z, K, L, M, N]\nA: "
BASELINE = {"causal": "ar.greedy", "diffusion": "dlm.baseline"}


def synthetic(millions: float) -> tuple[CausalLM, str]:
    """A random Llama-style causal LM of about `millions` million parameters (vocabulary 8192, 8 layers)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab, layers = 8192, 8
    hidden = 64
    while (2 * vocab * hidden + layers * 12 * hidden * hidden) < millions * 1e6:
        hidden += 64
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                      num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 64),
                      max_position_embeddings=1024, eos_token_id=vocab + 1, pad_token_id=0)
    torch.manual_seed(0)
    return CausalLM(LlamaForCausalLM(cfg).eval(), None, f"synthetic-{millions:g}M"), f"synthetic-{millions:g}M"


def one(model, method: str, max_new: int) -> tuple[float, int]:
    """(seconds, new tokens) of one generation."""
    prompt = PROMPT if model.tokenizer is not None else list(range(1, 33))
    start = time.perf_counter()
    result = fastdecode.generate(model, prompt, method, max_new_tokens=max_new)
    return time.perf_counter() - start, result.stats.new_tokens


def measure(model, name: str, method: str, threads: list[int], reps: int, max_new: int, f) -> None:
    for t in threads:  # warm-up at every thread count
        torch.set_num_threads(t)
        one(model, method, 8)
    for rep in range(reps):
        for t in threads:
            torch.set_num_threads(t)
            seconds, tokens = one(model, method, max_new)
            row = {"model": name, "parameters": model.num_parameters, "method": method, "threads": t, "repeat": rep,
                   "new_tokens": tokens, "seconds": round(seconds, 4), "tokens_per_s": round(tokens / seconds, 2),
                   "load_average_1m": round(os.getloadavg()[0], 2), "machine": machine(model.device)}
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(json.dumps({k: v for k, v in row.items() if k != "machine"}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=["zoo:ar-tiny", "zoo:ar-small", "zoo:dlm-small"])
    ap.add_argument("--synthetic", nargs="*", type=float, default=[], help="sizes in millions of parameters")
    ap.add_argument("--methods", nargs="*", default=[], help="extra methods for causal models (e.g. spec.pld)")
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        for source in args.models:
            model = fastdecode.load(source, device="cpu")
            methods = [BASELINE[model.kind], *(args.methods if model.kind == "causal" else [])]
            for method in methods:
                measure(model, source, method, args.threads, args.reps, args.max_new_tokens, f)
        for millions in args.synthetic:
            model, name = synthetic(millions)
            measure(model, name, "ar.greedy", args.threads, args.reps, args.max_new_tokens, f)


if __name__ == "__main__":
    main()
