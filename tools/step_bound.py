"""What one greedy decode step costs on this machine, per path, and the floor an fp32 torch path cannot go under.

For the prompts of a suite it times, taking turns per prompt (so a slow spell of a shared machine falls on all):
  - `generate`: transformers' `model.generate(do_sample=False)` with its dynamic cache (the reference users run);
  - `ar.greedy`: fastdecode's default path (preallocated cache, the direct forward of models/native.py where the
    architecture has one);
  - `ar.greedy:transformers-forward`: the same driver and cache through transformers' module forward (native=False);
  - `matmul-floor`: only the step's weight matmuls (every projection of every layer and the LM head, same shapes, same
    weights, one token), run as many times as the others made decode steps: no attention, norms, RoPE or Python.
Each row holds seconds per generated token and the ratio of `generate`'s to it (higher = faster), both in wall time and
in this process's CPU time: with one torch thread the CPU time is what the step cost, unswayed by other processes of a
shared machine, which lengthen the wall time of whatever runs beside them. The floor says how far any fp32 torch path
on this CPU could go: if generate / floor is under a target, no fp32 torch engine reaches it.

    python tools/step_bound.py --model zoo:ar-small --suite code --limit 10 --max-new-tokens 128 \
        --out docs/results/engine/step_bound.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fastdecode  # noqa: E402
from fastdecode.bench.jobs import machine  # noqa: E402
from tools.batch_speed import prompts_of  # noqa: E402


def weight_matmuls(model) -> list[torch.Tensor]:
    """Every 2-D weight a decode step multiplies a token's hidden state by (embeddings excluded: a lookup)."""
    embed = model.model.get_input_embeddings().weight
    weights = [p for p in model.model.parameters() if p.dim() == 2 and p is not embed]
    return weights + [embed] if getattr(model.config, "tie_word_embeddings", False) else weights


def floor_step(weights: list[torch.Tensor]) -> None:
    x: dict[int, torch.Tensor] = {}
    for w in weights:
        inp = x.setdefault(w.shape[1], torch.randn(1, 1, w.shape[1], dtype=w.dtype))
        F.linear(inp, w)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="zoo:ar-small")
    ap.add_argument("--suite", default="code")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = fastdecode.load(args.model)
    native = model.native
    prompts = prompts_of(args.suite, args.limit)
    weights = weight_matmuls(model)
    eos = sorted(model.eos_token_ids)

    def clocks() -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    def since(start: tuple[float, float]) -> tuple[float, float]:
        wall, cpu = clocks()
        return wall - start[0], cpu - start[1]

    def hf(prompt: str) -> tuple[tuple[float, float], list[int]]:
        ids = torch.tensor([model.tokenizer.encode(prompt)])
        start = clocks()
        with torch.inference_mode():
            out = model.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                       max_new_tokens=args.max_new_tokens, eos_token_id=eos,
                                       pad_token_id=model.pad_token_id)
        return since(start), out[0, ids.shape[1]:].tolist()

    def ours(prompt: str, direct: bool) -> tuple[tuple[float, float], list[int]]:
        model.native = native if direct else None
        start = clocks()
        r = fastdecode.generate(model, prompt, "ar.greedy", max_new_tokens=args.max_new_tokens)
        model.native = native
        return since(start), r.token_ids

    def floor(steps: int) -> tuple[float, float]:
        start = clocks()
        with torch.inference_mode():
            for _ in range(steps):
                floor_step(weights)
        return since(start)

    names = ["generate", "ar.greedy", "ar.greedy:transformers-forward", "matmul-floor"]
    per_token: dict[str, list[tuple[float, float]]] = {n: [] for n in names}  # (wall, cpu) seconds per token
    equal = {n: 0 for n in names[1:3]}
    ours(prompts[0], True), ours(prompts[0], False), hf(prompts[0]), floor(8)  # warm-up
    for _ in range(args.reps):
        for prompt in prompts:
            t_hf, ref = hf(prompt)
            ref = ref[: next((i + 1 for i, t in enumerate(ref) if t in eos), len(ref))]
            n = len(ref)
            per_token["generate"].append((t_hf[0] / n, t_hf[1] / n))
            for name, direct in (("ar.greedy", True), ("ar.greedy:transformers-forward", False)):
                t, ids = ours(prompt, direct)
                per_token[name].append((t[0] / max(1, len(ids)), t[1] / max(1, len(ids))))
                equal[name] += ids == ref
            t = floor(n)
            per_token["matmul-floor"].append((t[0] / n, t[1] / n))

    def median(name: str, clock: int) -> float:
        return statistics.median(x[clock] for x in per_token[name])

    base, base_cpu = median("generate", 0), median("generate", 1)
    meta = machine(model.device)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        for name in names:
            s, cpu = median(name, 0), median(name, 1)
            row = {
                "variant": name, "model": args.model, "suite": args.suite, "prompts": len(prompts), "reps": args.reps,
                "max_new_tokens": args.max_new_tokens, "ms_per_token": round(1000 * s, 3),
                "speedup_vs_generate": round(base / s, 3), "cpu_ms_per_token": round(1000 * cpu, 3),
                "cpu_speedup_vs_generate": round(base_cpu / cpu, 3),
                "equal_to_generate": (f"{equal[name]}/{len(prompts) * args.reps}" if name in equal else None),
                "direct_forward": native is not None, "machine": meta,
            }
            f.write(json.dumps(row) + "\n")
            print(f"{name:34s} {row['ms_per_token']:8.3f} ms/token  {row['speedup_vs_generate']:.2f}x generate()  "
                  f"CPU {row['cpu_ms_per_token']:8.3f} ms/token  {row['cpu_speedup_vs_generate']:.2f}x"
                  + (f"  equal {row['equal_to_generate']}" if row["equal_to_generate"] else ""))


if __name__ == "__main__":
    main()
