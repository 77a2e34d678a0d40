"""The `structured` suite: constraint kind x method, with and without the constraint.

For the zoo tasks of the `structured` suite (answers that are a JSON array, a regex, a grammar) and the JSON-schema
feature classes of `fastdecode.bench.tasks.structured` (enums, nested objects, bounded arrays, string formats,
anyOf), every method runs each item unconstrained and constrained. One JSONL row per generation (resumable: rows
already in --out are skipped); then a Markdown table of the summary (--table).

    python tools/structured.py --threads 1    # writes docs/results/structured/structured.jsonl and .md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import fastdecode  # noqa: E402
from fastdecode.bench.evaluate import default_budget  # noqa: E402
from fastdecode.bench.suites import get_suite  # noqa: E402
from fastdecode.bench.tasks import TASKS, format_prompt  # noqa: E402
from fastdecode.bench.tasks.structured import SCHEMA_TASKS, TASK_CONSTRAINTS  # noqa: E402
from fastdecode.speculative.memory import DrafterMemory  # noqa: E402

# (label, method, model, rule for dlm)
METHODS = [("ar.greedy", "ar.greedy", "ar", None), ("spec.pld", "spec.pld", "ar", None),
           ("spec.suffix", "spec.suffix", "ar", None), ("spec.draft_model", "spec.draft_model", "ar", None),
           ("dlm.threshold", "dlm.threshold", "dlm", "lave"),
           ("dlm.threshold+prefix", "dlm.threshold", "dlm", "prefix")]
KIND_LABEL = {"json_schema": "zoo JSON schema", "regex": "zoo regex", "grammar": "zoo grammar"}
SCHEMA_BUDGET = {"ar": 96, "dlm": 96}  # the string-formats object needs about 80 tokens


def jobs(items_per_task: int | None, schema_repeats: int) -> list[dict[str, Any]]:
    out = []
    for name, n in get_suite("structured").tasks:
        task = TASKS[name]
        for i, item in enumerate(task.items(1_000_000, min(n, items_per_task or n))):
            c = TASK_CONSTRAINTS[name](item)
            out.append({"task": name, "index": i, "item": item, "constraint": c, "group": KIND_LABEL[c.kind]})
    for st in SCHEMA_TASKS:
        for i in range(schema_repeats):
            out.append({"task": st.name, "index": i, "item": None, "constraint": st.constraint(),
                        "prompt": st.prompt + (" " * i), "group": "JSONSchemaBench classes"})
    return out


def valid(compiled, ids: list[int], eos: frozenset[int]) -> bool:
    """A complete sentence of the grammar, ended by EOS within the budget."""
    return bool(ids) and ids[-1] in eos and compiled.grammar.start().advance(list(ids)) == len(ids)


def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    models = {"ar": fastdecode.load("zoo:ar-small"), "dlm": fastdecode.load("zoo:dlm-small")}
    draft = fastdecode.load("zoo:ar-tiny")
    out = Path(args.out)
    done = set()
    if out.exists():
        for line in out.read_text().splitlines():
            r = json.loads(line)
            done.add((r["task"], r["index"], r["label"], r["constrained"]))
    with out.open("a") as fh:
        for job in jobs(args.items, args.schema_repeats):
            for label, method, which, rule in METHODS:
                model = models[which]
                item = job["item"]
                prompt = format_prompt(item.prompt) if item is not None else format_prompt(job["prompt"])
                budget = default_budget(TASKS[job["task"]], model) if item is not None else SCHEMA_BUDGET[which]
                for constrained in (False, True):
                    if label.endswith("+prefix") and not constrained:
                        continue  # the same run as dlm.threshold unconstrained
                    key = (job["task"], job["index"], label, constrained)
                    if key in done:
                        continue
                    c = job["constraint"]
                    if rule is not None:
                        c.diffusion = rule
                    compiled = c.compile(model)
                    kw: dict[str, Any] = {"max_new_tokens": budget}
                    if method == "spec.draft_model":
                        kw["draft"] = draft
                    if method.startswith("spec."):
                        kw["memory"] = DrafterMemory()  # no learning across items: each row stands alone
                    t0 = time.perf_counter()
                    r = fastdecode.generate(model, prompt, method, constraint=compiled if constrained else None,
                                            **kw)
                    wall = time.perf_counter() - t0
                    s = r.stats
                    row = {
                        "task": job["task"], "index": job["index"], "group": job["group"], "kind": c.kind,
                        "label": label, "method": method, "rule": rule, "constrained": constrained,
                        "model": "zoo:" + ("ar-small" if which == "ar" else "dlm-small"),
                        "valid": valid(compiled, r.token_ids, model.eos_token_ids),
                        "score": TASKS[job["task"]].score(item, r.text) if item is not None else None,
                        "new_tokens": s.new_tokens, "forwards": s.forwards, "proposed": s.proposed,
                        "accepted": s.accepted, "wall_s": wall, "budget": budget,
                        "compile_s": compiled.compile_s, "mask_s": compiled.mask_s if constrained else 0.0,
                        "masks": compiled.masks if constrained else 0, "text": r.text,
                        "threads": args.threads, "torch": torch.__version__,
                    }
                    fh.write(json.dumps(row) + "\n")
                    fh.flush()
                    print(f"{job['task']} #{job['index']} {label} {'constrained' if constrained else 'free'}: "
                          f"valid={row['valid']} score={row['score']} tpf={s.new_tokens / max(s.forwards, 1):.2f}",
                          flush=True)


def table(rows: list[dict[str, Any]]) -> str:
    cells: dict[tuple[str, str], dict[bool, list[dict[str, Any]]]] = defaultdict(lambda: {False: [], True: []})
    for r in rows:
        cells[(r["group"], r["label"])][r["constrained"]].append(r)
    free_dlm = {k[0]: v[False] for k, v in cells.items() if k[1] == "dlm.threshold"}

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs) if xs else float("nan")

    lines = [
        "| constraint | method | n | valid, constrained | valid, free | accuracy, constrained | accuracy, free | "
        "TPF, constrained | TPF, free | acceptance, constrained | acceptance, free | mask ms / forward | "
        "mask µs / token | compile ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    order = ["zoo JSON schema", "zoo regex", "zoo grammar", "JSONSchemaBench classes"]
    labels = [m[0] for m in METHODS]
    for group in order:
        for label in labels:
            if (group, label) not in cells:
                continue
            con, free = cells[(group, label)][True], cells[(group, label)][False]
            if label.endswith("+prefix"):
                free = free_dlm.get(group, [])
            if not con:
                continue

            def pct(rs: list[dict[str, Any]], key: str) -> str:
                vals = [float(r[key]) for r in rs if r[key] is not None]
                return f"{100 * mean(vals):.0f} %" if vals else "n/a"

            def tpf(rs: list[dict[str, Any]]) -> str:
                return f"{sum(r['new_tokens'] for r in rs) / max(sum(r['forwards'] for r in rs), 1):.2f}" if rs else ""

            def acc(rs: list[dict[str, Any]], spec: bool = label.startswith("spec.")) -> str:
                p = sum(r["proposed"] for r in rs)
                return f"{sum(r['accepted'] for r in rs) / p:.2f}" if p and spec else "–"

            fwd = sum(r["forwards"] for r in con)
            tok = sum(r["new_tokens"] for r in con)
            mask = sum(r["mask_s"] for r in con)
            lines.append(
                f"| {group} | {label} | {len(con)} | {pct(con, 'valid')} | {pct(free, 'valid')} | "
                f"{pct(con, 'score')} | {pct(free, 'score')} | {tpf(con)} | {tpf(free)} | {acc(con)} | {acc(free)} | "
                f"{1000 * mask / max(fwd, 1):.2f} | {1e6 * mask / max(tok, 1):.0f} | "
                f"{1000 * mean([r['compile_s'] for r in con]):.2f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/results/structured/structured.jsonl")
    parser.add_argument("--table", default="docs/results/structured/structured.md")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--items", type=int, default=None, help="cap on items per zoo task (default: the suite's)")
    parser.add_argument("--schema-repeats", type=int, default=3, help="runs of each JSON-schema feature class")
    parser.add_argument("--table-only", action="store_true", help="only rebuild the table from --out")
    args = parser.parse_args()
    if not args.table_only:
        run(args)
    rows = [json.loads(line) for line in Path(args.out).read_text().splitlines() if line.strip()]
    Path(args.table).write_text(
        "# Constrained decoding: constraint kind x method\n\nMade by `make results-structured` "
        "(`python tools/structured.py --threads 1`) from `docs/results/structured/structured.jsonl`; zoo:ar-small "
        "(spec.draft_model with zoo:ar-tiny), zoo:dlm-small for dlm.threshold (LAVE; +prefix: the left-to-right "
        "prefix rule). "
        "valid = a complete sentence of the constraint ended by EOS within the budget; accuracy = the task's scorer "
        "(n/a for the JSON-schema classes, which have no reference); TPF = generated tokens per target forward; "
        "acceptance = accepted / drafted tokens; mask time includes the drafts' cut checks and the dlm commit "
        "filters; compile = schema / regex / grammar to a ready matcher, per request.\n\n" + table(rows)
    )
    print(Path(args.table).read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
