"""The most any drafter that copies from the request's context could gain on a suite, on this machine (JSONL).

Prompt lookup, n-gram and suffix-tree drafters propose the tokens that followed an earlier occurrence of the
context's last tokens. This gives such a drafter every advantage: at each step an oracle picks, among all earlier
occurrences of the last token in the prompt and the output so far, the one whose continuation agrees longest with
what the target will emit (its greedy answer, read from a bench results file), and drafts the number of those
tokens that minimises the answer's total forward cost (a dynamic programme over the answer). Forward costs come
from `tools/forward_cost.py`'s curve (a forward over w tokens costs `over_width_1(w)` one-token forwards,
interpolated between measured widths; the prompt's forward by its length), so the bound is for the machine that
curve was measured on; drafting and the loop's bookkeeping are free. A real drafter does not know which copy
is right, so it reaches less; if the bound is below a target speed-up, no copying drafter reaches it there.

    python tools/copy_bound.py --results docs/results/spec-parallel-lists.jsonl \
        --cost docs/results/cost/ar-small.jsonl --out docs/results/cost/copy-bound.jsonl
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fastdecode.bench.harness import read_rows  # noqa: E402
from fastdecode.bench.tasks import TASKS, format_prompt  # noqa: E402


class Cost:
    """A forward's cost in one-token forwards by its width, from a forward-cost curve."""

    def __init__(self, rows: list[dict]) -> None:
        pairs = sorted((r["width"], r["over_width_1"]) for r in rows)
        if not pairs or pairs[0][0] != 1:
            raise SystemExit("the cost curve needs a width-1 row (rerun tools/forward_cost.py with --widths 1 ...)")
        self.widths = [w for w, _ in pairs]
        self.ratios = [r for _, r in pairs]

    def __call__(self, width: int) -> float:
        w, r = self.widths, self.ratios
        if width >= w[-1]:  # past the curve: linear in the width from the widest point
            return r[-1] * width / w[-1]
        i = bisect.bisect_left(w, width)
        if w[i] == width:
            return r[i]
        return r[i - 1] + (r[i] - r[i - 1]) * (width - w[i - 1]) / (w[i] - w[i - 1])


def copyable(context: list[int], future: list[int]) -> int:
    """How many of `future`'s first tokens follow some earlier occurrence of `context`'s last token verbatim."""
    last, best = context[-1], 0
    for j in range(len(context) - 1):
        if context[j] == last:
            n = 0
            while n < len(future) and j + 1 + n < len(context) and context[j + 1 + n] == future[n]:
                n += 1
            best = max(best, n)
    return best


def best_plan(prompt: list[int], answer: list[int], cost: Cost) -> tuple[float, int]:
    """(forward cost, steps) of the cheapest way to emit `answer` after the prompt's forward (which emits its
    first token) with drafts copied from the context, each at most as long as the copyable run there."""
    n = len(answer)
    best = [0.0] * (n + 1)
    steps = [0] * (n + 1)
    for i in range(n - 1, 0, -1):  # i tokens emitted; a step drafts k tokens and emits k + 1
        best[i] = float("inf")
        for k in range(copyable(prompt + answer[:i], answer[i:]) + 1):
            j = min(n, i + k + 1)
            if cost(k + 1) + best[j] < best[i]:
                best[i], steps[i] = cost(k + 1) + best[j], 1 + steps[j]
    return best[1] if n > 1 else 0.0, steps[1] if n > 1 else 0


def bound(rows: list[dict], cost: Cost, encode) -> dict:
    """The copy oracle against greedy decoding over the baseline rows of one suite and model."""
    greedy = oracle = 0.0
    tokens = steps = 0
    for row in rows:
        task = TASKS[row["task"]]
        prompt = encode(format_prompt(task.items(row["seed"], row["item"] + 1)[row["item"]].prompt))
        answer = row["token_ids"]
        if len(prompt) != row["prompt_tokens"]:
            raise SystemExit(f"{row['task']} item {row['item']}: the prompt encodes to {len(prompt)} tokens, the "
                             f"results row says {row['prompt_tokens']}: a different tokenizer or task version")
        plan_cost, plan_steps = best_plan(prompt, answer, cost)
        greedy += cost(len(prompt)) + len(answer) - 1
        oracle += cost(len(prompt)) + plan_cost
        tokens += len(answer) - 1
        steps += plan_steps
    return {"items": len(rows), "speedup_bound": greedy / oracle, "tau_of_plan": tokens / max(1, steps)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", nargs="+", required=True, help="bench JSONL files with baseline rows")
    parser.add_argument("--cost", required=True, help="a forward-cost curve from tools/forward_cost.py")
    parser.add_argument("--out", required=True, help="JSONL to write, one row per suite and model")
    args = parser.parse_args(argv)

    import fastdecode

    cost = Cost([json.loads(line) for line in Path(args.cost).read_text(encoding="utf-8").splitlines()])
    out = []
    for path in args.results:
        groups: dict[tuple[str, str], dict[tuple, dict]] = {}
        for row in read_rows(path):
            if row.get("is_baseline") and row.get("token_ids") is not None:
                groups.setdefault((row["suite"], row["model"]), {})[(row["task"], row["seed"], row["item"])] = row
        if not groups:
            raise SystemExit(f"{path} has no baseline rows with token ids")
        for (suite, model_name), rows in groups.items():
            model = fastdecode.load(model_name)
            if model.kind != "causal":
                continue  # a diffusion baseline: nothing to draft for
            out.append({"suite": suite, "model": model_name, "results": str(path), "cost": args.cost,
                        **bound(list(rows.values()), cost, model.encode)})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in out), encoding="utf-8")
    for r in out:
        print(f"{r['suite']} · {r['model']}: {r['items']} answers, at most {r['speedup_bound']:.2f}x greedy "
              f"(tau {r['tau_of_plan']:.2f}) for a drafter copying from the context")


if __name__ == "__main__":
    main()
