"""`make results-sparse`: every sparse.* rule x budget x context length against dense greedy decoding, one model.

Two parts, one JSONL file each under --out:

- accuracy.jsonl (contexts 1k-4k): for each longctx test item, the task score of each rule's greedy answer and its
  agreement with dense greedy (the share of the dense answer's tokens reproduced before the first difference),
  the KV bytes read per generated token and the KV bytes the rule must hold;
- speed.jsonl (contexts 8k-16k): decode tokens/s of dense greedy and of each rule on the same prefilled cache, the
  runs interleaved and repeated, the speed-up over the dense run of the same repeat.

The prompt is prefilled once per item (densely, in chunks, SnapKV watching the prefill); each rule then decodes
from that cache and the cache is rolled back to the prompt, so every rule and the dense baseline start from the
same state. Timings cover the decode steps only (the prefill is dense for every rule).

    python tools/sparse_results.py --model zoo:ar-small --rope linear:32 --threads 1 --out docs/results/sparse
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import fastdecode
from fastdecode.attention import make_selector, rules
from fastdecode.bench.tasks import DEFAULT_TEST_SEED, format_prompt, get_task
from fastdecode.bench.tasks.longctx import OPS

CHUNK = 2048


class Fanout:
    """Shows a prefill to several rules (SnapKV reads its observation window there); attends densely."""

    def __init__(self, selectors) -> None:
        self.selectors = selectors

    def begin(self, cache, plan) -> None:
        for s in self.selectors:
            s.begin(cache, plan)
        plan.sparse = self

    def select(self, layer, q, k, v, mask):
        for s in self.selectors:
            s.observe(layer, q, k, mask)
        return None


def prefill(model, ids: list[int], capacity: int, watch) -> tuple[object, torch.Tensor, float]:
    cache = model.new_cache(capacity=capacity)
    x = torch.tensor([ids])
    bounds = list(range(0, len(ids), CHUNK)) + [len(ids)]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] < 64:  # no short last chunk: it would decode sparsely
        bounds.pop(-2)
    t0 = time.perf_counter()
    for a, b in zip(bounds, bounds[1:], strict=False):
        logits = model.forward(x[:, a:b], torch.arange(a, b)[None], cache, num_logits=1, sparse=Fanout(watch))
    return cache, logits[0, -1], time.perf_counter() - t0


def decode(model, cache, first: torch.Tensor, start: int, steps: int, sparse, eos: set[int]) -> tuple[list[int], float]:
    token = int(first.argmax())
    out = [token]
    t0 = time.perf_counter()
    for i in range(steps - 1):
        if token in eos:
            break
        logits = model.forward(torch.tensor([[token]]), torch.tensor([[start + i]]), cache,
                               **({"sparse": sparse} if sparse is not None else {}))
        token = int(logits[0, -1].argmax())
        out.append(token)
    dt = time.perf_counter() - t0
    cache.crop(start)
    return out, dt


def answer_text(model, tokens: list[int], eos: set[int]) -> str:
    """The text before the first EOS (the speed part decodes past it)."""
    end = next((i for i, t in enumerate(tokens) if t in eos), len(tokens))
    return model.tokenizer.decode(tokens[:end])


def agreement(dense: list[int], other: list[int]) -> float:
    n = 0
    for a, b in zip(dense, other, strict=False):
        if a != b:
            break
        n += 1
    return n / max(1, len(dense))


def shape(model) -> tuple[int, int, int, int]:
    c = model.config
    heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    return c.num_hidden_layers, heads, getattr(c, "head_dim", c.hidden_size // c.num_attention_heads), 4


def run_item(model, rule_names, budgets, item, steps, repeats, part, context, out_f, extra) -> None:
    L, H, D, E = shape(model)
    ids = model.tokenizer(format_prompt(item.prompt))["input_ids"]
    P = len(ids)
    selectors = {(r, b): make_selector(r, model, budget=b, **({"window": 16} if r == "snapkv" else {}))
                 for r in rule_names for b in budgets}
    cache, first, prefill_s = prefill(model, ids, P + steps + 8, list(selectors.values()))
    eos = set(model.eos_token_ids)
    # the speed part times every configuration over the same number of steps: decoding on past EOS (the score reads
    # the text before it), else a dense answer that ends after two tokens would be timed against 24 sparse steps
    stop = eos if part != "speed" else set()
    task = get_task(item.task)
    for rep in range(repeats):
        dense, dense_s = decode(model, cache, first, P, steps, None, stop)
        n = len(dense)
        dense_read = sum(2 * (P + i) * H * L for i in range(n - 1)) / max(1, n - 1) * D * E  # per decode step
        base = {"part": part, "context": context, "prompt_tokens": P, "task": item.task, "repeat": rep, **extra}
        text = answer_text(model, dense, eos)
        rows = [{**base, "method": "ar.greedy", "budget": None, "score": task.score(item, text), "agree": 1.0,
                 "tokens": n, "decode_s": round(dense_s, 4), "tokens_per_s": round((n - 1) / dense_s, 2),
                 "speedup": 1.0, "kv_read_bytes_per_token": dense_read, "kv_dense_read_bytes_per_token": dense_read,
                 "kv_held_bytes": 2 * (P + n) * H * L * D * E, "prefill_s": round(prefill_s, 2)}]
        for (r, b), sel in selectors.items():
            before = (sel.reads.key_cols + sel.reads.value_cols, sel.reads.forwards)
            got, dt = decode(model, cache, first, P, steps, sel, stop)
            read = (sel.reads.key_cols + sel.reads.value_cols - before[0]) / max(1, sel.reads.forwards - before[1])
            text = answer_text(model, got, eos)
            rows.append({**base, "method": f"sparse.{r}", "budget": b, "score": task.score(item, text),
                         "agree": round(agreement(dense, got), 4), "tokens": len(got), "decode_s": round(dt, 4),
                         "tokens_per_s": round((len(got) - 1) / dt, 2),
                         "speedup": round((dense_s / max(1, n - 1)) / (dt / max(1, len(got) - 1)), 3),
                         "kv_read_bytes_per_token": read * D * E, "kv_dense_read_bytes_per_token": dense_read,
                         "kv_held_bytes": 2 * sel.held_columns(P + len(got), H, L) * D * E})
        for row in rows:
            out_f.write(json.dumps(row) + "\n")
        out_f.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="zoo:ar-small")
    ap.add_argument("--rope", default="linear:32", help="extend the model's positions: linear:F, base:F or none")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="docs/results/sparse")
    ap.add_argument("--accuracy-contexts", default="1k,2k,4k")
    ap.add_argument("--speed-contexts", default="8k,16k")
    ap.add_argument("--items", type=int, default=2, help="test items per task and context (accuracy)")
    ap.add_argument("--budgets", default="64,256,1024")
    ap.add_argument("--rules", default=",".join(rules()))
    ap.add_argument("--steps", type=int, default=16, help="decode steps (accuracy)")
    ap.add_argument("--speed-steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2, help="interleaved repeats (speed)")
    ap.add_argument("--selfspec-contexts", default="", help="contexts for spec.sparse_self against ar.greedy")
    ap.add_argument("--selfspec-rules", default="streaming,quest")
    ap.add_argument("--selfspec-steps", type=int, default=48)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = fastdecode.load(args.model)
    if args.rope != "none":
        from fastdecode.train.long import extend_positions

        kind, factor = args.rope.split(":")
        extend_positions(model.model, kind, float(factor), 32768)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rule_names = [r for r in args.rules.split(",") if r]
    budgets = [int(b) for b in args.budgets.split(",")]
    extra = {"model": args.model, "rope": args.rope, "threads": args.threads, "dtype": "float32"}
    if args.accuracy_contexts:
        with open(out / "accuracy.jsonl", "w") as f:
            for size in args.accuracy_contexts.split(","):
                for op in OPS:
                    for item in op(size).items(DEFAULT_TEST_SEED, args.items):
                        run_item(model, rule_names, budgets, item, args.steps, 1, "accuracy", size, f, extra)
    if args.speed_contexts:
        with open(out / "speed.jsonl", "w") as f:
            for size in args.speed_contexts.split(","):
                item = get_task(f"longctx.passkey@{size}").items(DEFAULT_TEST_SEED, 1)[0]
                run_item(model, rule_names, budgets, item, args.speed_steps, args.repeats, "speed", size, f, extra)
    if args.selfspec_contexts:
        with open(out / "selfspec.jsonl", "w") as f:
            for size in args.selfspec_contexts.split(","):
                selfspec(model, size, args, f, extra)


def timed(model, prompt: str, method: str, n: int, **params):
    """(result, decode seconds, decode tokens): the time from the first step's event (the prefill and the first
    token) to the last, and the tokens emitted after the first step."""
    from fastdecode.types import Finished

    first_t, first_n, last_t = None, 0, 0.0
    for ev in fastdecode.stream(model, prompt, method, max_new_tokens=n, **params):
        now = time.perf_counter()
        if isinstance(ev, Finished):
            res = ev.results[0]
            break
        if first_t is None:
            first_t, first_n = now, len(ev.tokens[0])
        last_t = now
    assert first_t is not None
    return res, last_t - first_t, len(res.token_ids) - first_n


def selfspec(model, size: str, args, out_f, extra: dict) -> None:
    """spec.sparse_self against ar.greedy on one item, decode time after the first step (the prefill) only."""
    item = get_task(f"longctx.passkey@{size}").items(DEFAULT_TEST_SEED, 1)[0]
    prompt = format_prompt(item.prompt)
    n = args.selfspec_steps
    ref, dense_s, dense_n = timed(model, prompt, "ar.greedy", n)
    rows = [{"part": "selfspec", "context": size, "method": "ar.greedy", "budget": None, "tokens": len(ref.token_ids),
             "decode_s": round(dense_s, 3), "decode_tokens": dense_n, "speedup": 1.0, **extra}]
    for rule in args.selfspec_rules.split(","):
        for b in [int(x) for x in args.budgets.split(",")]:
            r, dec, dec_n = timed(model, prompt, "spec.sparse_self", n, rule=rule, budget=b)
            rows.append({"part": "selfspec", "context": size, "method": f"spec.sparse_self:{rule}", "budget": b,
                         "tokens": len(r.token_ids), "identical": r.token_ids == ref.token_ids,
                         "accepted": r.stats.accepted, "proposed": r.stats.proposed, "forwards": r.stats.forwards,
                         "decode_s": round(dec, 3), "decode_tokens": dec_n,
                         "speedup": round((dense_s / dense_n) / (dec / dec_n), 3), **extra})
    for row in rows:
        out_f.write(json.dumps(row) + "\n")
    out_f.flush()


if __name__ == "__main__":
    main()
