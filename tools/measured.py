"""Rewrite the measured figures quoted in the docs from the committed results (`make docs-figures`).

Docs mark each quoted figure span as `<!--m NAME-->...<!--/m-->`, NAME a short name that docs/figures.txt defines
as one of the KEYs below (`pld.lists.tpf = fig:tpf|parallel-lists|zoo:ar-small|spec.pld`); this script recomputes
the text between the markers from `docs/results/*.jsonl` with the report's own summaries, so every figure in
README.md and docs/*.md comes from a command. `--check` rewrites nothing and fails if a span is out of date, if a
doc quotes a name docs/figures.txt does not define, or if a name defined there is quoted nowhere (a test runs it).
To quote a new figure: add `NAME = KEY` to docs/figures.txt, put `<!--m NAME--><!--/m-->` in the doc, run
`make docs-figures`.

Keys:
  dlm:LABEL       per-suite figures of a dlm configuration on zoo:dlm-small (parallel-lists and puzzles)
  dlm-baseline    dlm.baseline's accuracy and TPF on both suites
  spec:LABEL      tau and speed-up of a speculative configuration on zoo:ar-small (parallel-lists and code)
  readme-table    the README's results table (rows listed in README_ROWS below)
  answers:SUITE|MODEL   the baseline's answer length in tokens: mean (shortest–longest)
  card:NAME|FIELD       a zoo model's figure from the card `fastdecode train` wrote (fastdecode/zoo/NAME/README.md):
                  mean (mean exact match on the deterministic list tasks), agreement (ar-tiny's greedy agreement
                  with ar-small), minutes (training time), items (test items per task), acc@TASK (one task's
                  accuracy)
  loops:SUITE|MODEL     "N of M": baseline answers that run to the token limit in a loop (at most LOOP_TOKENS
                  distinct tokens among their last LOOP_WINDOW)
  fig:STAT|SUITE|MODEL|LABEL[|REF]   one figure: acc, tpf, tps (tokens/s), speedup (over the file's baseline),
                  equal (share of items equal to the baseline), ratio (tokens/s over REF's), fewer (REF's
                  forwards per item over LABEL's), drafting / verifying (share of wall time), draftfwd
                  (draft forwards per target forward), msfwd (wall ms per target forward; not for the baseline, whose
                  rows may come from several runs), basems (wall ms per baseline forward in LABEL's run), stepcost
                  (a step's wall time over a baseline step's), draftcost (one draft forward's wall time over a baseline
                  step's: c), verifycost (a verification's wall time over a baseline step's: v), accept (the share of
                  target forwards accepting the draft token at each draft position); tpf@TASK is one task's TPF
  learned:FILE|STAT|SUITE|MODEL|LABEL[|REF]   as fig:, from the trained drafters' docs/results/learned/FILE.jsonl
                  (each of those files measures its own baseline; `--show FILE` lists every configuration's terms)
  image-table:DIR  the last `fastdecode bench-image` run in docs/results/image/DIR/metrics.jsonl: each method's
                  forwards per image, FD, class accuracy, batch-1 speed-up and grid of samples
  gpu:FILE|STAT|SUITE|MODEL|LABEL[|REF]   as learned:, from a GPU run's docs/results/gpu/FILE.jsonl
                  (`make results-gpu`; MODEL as the report heads it, e.g. `zoo:ar-small · bfloat16 exact`)
  learned-table:FILE   that file's table: every configuration's τ, speed-up, acceptance per draft position, draft
                  forwards a step, c and v
  cost:STEM|WIDTH|FIELD  a causal model's cached forward over WIDTH new tokens, from docs/results/cost/STEM.jsonl
                  (`tools/forward_cost.py`): ms (median wall ms), ratio (over a one-token forward), matmul (share
                  of its CPU time in matrix products), bound@TAU (TAU / ratio: the speed-up over greedy that steps
                  of this width emitting TAU tokens each would reach if drafting cost nothing)
  copybound:SUITE|FIELD  the most a drafter copying from the context could gain on SUITE's ar-small answers on the
                  cost curve's machine, from docs/results/cost/copy-bound.jsonl (`tools/copy_bound.py`): speedup
                  (over greedy), tau (of the plan that reaches it)
  bf16:NAME|FIELD  a zoo model with its weights rounded to bfloat16, from docs/results/zoo/bf16.jsonl
                  (`tools/zoo_bf16.py`): mean / card_mean (mean exact match on the deterministic list tasks, bf16 /
                  card), bpb / card_bpb (code bits per byte), agreement / card_agreement (ar-tiny's greedy agreement
                  with ar-small), mb / fp32_mb (megabytes of model.safetensors), changed (the tasks whose accuracy
                  moved, with the card's figure, or "none"), items (test items per task), sim / card_sim (code
                  similarity), minutes (the measurement's wall time)
  engine:LABEL|FIELD  the engine run (`make results-engine`), from docs/results/engine/engine.jsonl: speedup
                  (LABEL's tokens/s over ar.greedy's in the same run), inverse (ar.greedy's over LABEL's), tpf, tps
  llamacpp:LABEL|FIELD  as engine:, from docs/results/engine/llamacpp.jsonl (`make results-llamacpp`: llama.cpp's
                  methods beside fastdecode's on the same weights and items)
  step:VARIANT|FIELD  seconds per token of one greedy path, from docs/results/engine/step_bound.jsonl
                  (`tools/step_bound.py`): x-generate (transformers generate()'s wall time over this one), ms (wall
                  per token), cpu-x-generate / cpu-ms (the same in process CPU time), equal (outputs equal to
                  generate()'s, of the prompts)
  batch:METHOD|FIELD  a batch in one call against the same prompts one at a time, from
                  docs/results/engine/batch.jsonl (`tools/batch_speed.py`): speedup, batched / single (tokens/s),
                  batch (rows per call), equal (whether the outputs were equal)
  sparse:PART|CONTEXT|METHOD|BUDGET|FIELD  long-context sparse decoding, from docs/results/sparse/PART.jsonl
                  (`make results-sparse`); PART accuracy, speed or selfspec; CONTEXT e.g. 4k, or `all` (accuracy: every
                  length); BUDGET a number or - (dense); FIELD: score (mean task accuracy; score@OP for one task, e.g.
                  score@passkey), agree (mean agreement with dense greedy), mb (mean KV MB read per token), speedup
                  (median over repeats, over dense), tps (median tokens/s), identical (selfspec: tokens equal to
                  ar.greedy's)
LABEL is the report's configuration label as in docs/results/report.md, e.g. `dlm.threshold (cache=dual,
max_new_tokens=384)`, or a bare method name for its default configuration; MODEL is e.g. `zoo:dlm-small`.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fastdecode.bench.harness import read_rows  # noqa: E402
from fastdecode.bench.summary import Summary, summarize, uses_default_budget  # noqa: E402

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FIGURES = ROOT / "docs" / "figures.txt"  # NAME = KEY, one a line; # starts a comment
CARD_JSON = re.compile(r"## Measured on the test split\s*```json\n(?P<json>.*?)```", re.S)
# a marker right after a backtick is an example in inline code (`<!--m NAME-->...`), not a figure
SPAN = re.compile(r"(?<!`)<!--m (?P<key>[^>]+?)-->(?P<body>.*?)<!--/m-->", re.S)

# (suite, model, labels joined with " / " in one row, what the method column says)
README_ROWS = [
    ("code", "zoo:ar-small", ["spec.suffix (tree=False)"], "`spec.suffix`"),
    ("code", "zoo:ar-small", ["spec.pld", "hf.prompt_lookup"], "`spec.pld` / `hf.prompt_lookup`"),
    ("parallel-lists", "zoo:ar-small", ["spec.pld", "hf.prompt_lookup"], "`spec.pld` / `hf.prompt_lookup`"),
    ("parallel-lists", "zoo:ar-small",
     ["spec.draft_model (adaptive_stop=False, confidence_stop=0.4, num_draft_tokens=20)",
      "hf.assisted (adaptive_threshold=False)"],
     "`spec.draft_model` / `hf.assisted` (draft ar-tiny, same settings, a fixed threshold)"),
    ("parallel-lists", "zoo:dlm-small", ["dlm.baseline"], "`dlm.baseline` (one token per step)"),
    ("parallel-lists", "zoo:dlm-small", ["dlm.freedave"], "`dlm.freedave`"),
    ("parallel-lists", "zoo:dlm-small", ["dlm.threshold"], "`dlm.threshold`"),
    ("parallel-lists", "zoo:dlm-small", ["dlm.prophet"], "`dlm.prophet`"),
]


LOOP_TOKENS, LOOP_WINDOW = 4, 40


class Table(dict):
    """(suite, model, label) -> Summary, with the rows they summarise in `rows`."""

    rows: list[dict]
    results: Path


def load(results: Path) -> Table:
    rows = []
    for path in sorted(results.glob("*.jsonl")):
        for row in read_rows(path):
            row["_source"] = str(path)
            rows.append(row)
    table = Table({(s.suite, s.model, s.label): s for s in summarize(rows)})
    table.rows, table.results = rows, results
    return table


def baseline_answers(table: Table, spec: str) -> list[dict]:
    """One baseline row per item of SUITE|MODEL at the task's own budget (several runs repeat the baseline)."""
    suite, model = spec.split("|")
    s = baseline(table, suite, model)
    by_item = {(r["task"], r["item"], r["seed"]): r for r in table.rows
               if r["suite"] == suite and r["model"] == model and r["is_baseline"] and r["method"] == s.method
               and uses_default_budget(r)}
    return list(by_item.values())


def answers_text(table: Table, spec: str) -> str:
    lengths = [r["new_tokens"] for r in baseline_answers(table, spec)]
    return f"{sum(lengths) / len(lengths):.0f} tokens on average ({min(lengths)}–{max(lengths)})"


def loops_text(table: Table, spec: str) -> str:
    rows = baseline_answers(table, spec)
    loops = sum(r["finish_reason"] == "length" and len(set(r["token_ids"][-LOOP_WINDOW:])) <= LOOP_TOKENS for r in rows)
    return f"{loops} of {len(rows)}"


def pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


DEFAULT_BITS = {"cache=none", "max_new_tokens=per-task"}  # what a label shows for a default setting beside others


def get(table: dict, suite: str, model: str, label: str) -> Summary:
    """A configuration by its report label; a bare method name means its default configuration."""
    if (suite, model, label) in table:
        return table[(suite, model, label)]
    for (su, mo, la), s in table.items():
        if (su, mo, s.method) == (suite, model, label) and set(la[len(label) + 2:-1].split(", ")) <= DEFAULT_BITS:
            return s
    else:
        known = sorted(k[2] for k in table if k[:2] == (suite, model))
        raise SystemExit(f"no configuration {label!r} on {suite} / {model} in the results; known: {known}") from None


def baseline(table: dict, suite: str, model: str) -> Summary:
    """The baseline at each task's own budget (runs that override max_new_tokens have their own, labelled one)."""
    method = next(s.method for k, s in table.items() if k[:2] == (suite, model) and s.is_baseline)
    return get(table, suite, model, method)


def figure(table: dict, spec: str) -> str:
    stat, suite, model, label, *ref = spec.split("|")
    s = get(table, suite, model, label)
    r = get(table, suite, model, ref[0]) if ref else None
    if r is not None and r.is_baseline and not set(r.sources) & set(s.sources):
        raise SystemExit(f"bad figure {spec!r}: {ref[0]!r} is not the baseline measured beside {label!r}")

    def step(x: Summary) -> float:  # seconds of wall time per target forward
        return x.tpf / x.tokens_per_s

    def base_step() -> float:  # seconds per baseline forward in s's own run (its speed-up's denominator)
        return baseline(table, suite, model).tpf * s.speedup / s.tokens_per_s

    def ratio() -> float:  # timings against a baseline are the report's same-run speed-up
        return s.speedup if r.is_baseline else s.tokens_per_s / r.tokens_per_s

    def own_step() -> float:
        if s.is_baseline:  # pooled over every run (and machine) that measured it
            raise SystemExit(f"bad figure {spec!r}: use basems with a configuration to time the baseline of its run")
        return step(s)

    def draft_forward(x: Summary) -> float:  # seconds per draft forward
        if not x.draft_forwards_per_item:
            raise SystemExit(f"bad figure {spec!r}: {x.label} runs no draft forward")
        return (x.draft_share or 0.0) * step(x) * x.forwards_per_item / max(x.draft_forwards_per_item, 1e-9)

    values = {
        "acc": lambda: pct(s.accuracy), "tpf": lambda: f"{s.tpf:.2f}", "tps": lambda: f"{s.tokens_per_s:.1f}",
        "speedup": lambda: f"{s.speedup:.2f}×", "equal": lambda: f"{100 * (s.equal_rate or 0):.0f} %",
        "ratio": lambda: f"{ratio():.2f}×",
        "fewer": lambda: f"{r.forwards_per_item / s.forwards_per_item:.2f}×",
        "drafting": lambda: pct(s.draft_share), "verifying": lambda: pct(s.verify_share),
        "draftfwd": lambda: f"{s.draft_forwards_per_item / s.forwards_per_item:.1f}",
        "msfwd": lambda: f"{1000 * own_step():.1f}", "basems": lambda: f"{1000 * base_step():.1f}",
        "stepcost": lambda: f"{own_step() / base_step():.1f}×",
        "draftcost": lambda: f"{draft_forward(s) / base_step():.2f}×",
        "verifycost": lambda: f"{(s.verify_share or 0.0) * own_step() / base_step():.2f}",
        "accept": lambda: ", ".join(f"{a:.2f}" for a in s.accept_per_position),
    }
    stat, _, task = stat.partition("@")
    if task:  # one task's figure: tpf@TASK
        if stat != "tpf" or task not in s.tpf_by_task or ref:
            raise SystemExit(f"bad figure {spec!r}: only tpf takes @TASK, a task of the suite")
        return f"{s.tpf_by_task[task]:.2f}"
    if stat not in values or (stat in ("ratio", "fewer")) != bool(ref):
        raise SystemExit(f"bad figure {spec!r}: STAT is one of {sorted(values)}; ratio and fewer take a REF label")
    return values[stat]()


LEARNED = ROOT / "docs" / "results" / "learned"
GPU = ROOT / "docs" / "results" / "gpu"


@functools.cache
def learned_table(stem: str, folder: Path = LEARNED) -> Table:
    """A trained drafter's bench file (or a GPU run's), apart from the top-level rows (each file measures its own
    baseline)."""
    path = folder / f"{stem}.jsonl"
    if not path.exists():
        raise SystemExit(f"no {path.relative_to(ROOT)}: the key names a file of {folder.relative_to(ROOT)}/")
    return file_table(path)


def file_table(path: Path) -> Table:
    """The summaries of one results file alone."""
    rows = []
    for row in read_rows(path):
        row["_source"] = str(path)
        rows.append(row)
    table = Table({(s.suite, s.model, s.label): s for s in summarize(rows)})
    table.rows, table.results = rows, path
    return table


def learned_text(spec: str, folder: Path = LEARNED) -> str:
    stem, _, fig = spec.partition("|")
    return figure(learned_table(stem, folder), fig)


def learned_table_text(stem: str) -> str:
    """Every configuration of a trained drafter's bench file beside its suite's baseline: the terms of the speed
    model S = τ / (drafts·c + v)."""
    table = learned_table(stem)
    lines = ["| suite | method | τ (TPF) | speed-up | acceptance per draft position (share of target steps) "
             "| draft forwards a step | c | v |", "|---|---|---:|---:|---|---:|---:|---:|"]
    for (suite, model, label), s in table.items():
        if s.is_baseline:
            continue
        fig = f"|{suite}|{model}|{label}"
        accept = ", ".join(f"{a:.2f}" for a in s.accept_per_position[:5]) + (
            ", …" if len(s.accept_per_position) > 5 else "")
        drafts = s.draft_forwards_per_item / s.forwards_per_item
        c = figure(table, "draftcost" + fig).rstrip("×") if drafts else "–"
        lines.append(f"| {suite} ({s.items} items) | `{label}` | {s.tpf:.2f} | {s.speedup or 0:.2f}× | {accept} "
                     f"| {drafts:.2f} | {c} | {figure(table, 'verifycost' + fig)} |")
    return "\n" + "\n".join(lines) + "\n"


def image_table_text(spec: str) -> str:
    """One `fastdecode bench-image` run (docs/results/image/DIR/metrics.jsonl, its last run): each method's forwards
    per image, Fréchet distance, class accuracy and batch-1 speed-up beside its grid of samples."""
    folder = ROOT / "docs" / "results" / "image" / spec
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if line]
    run = rows[-1]["run"]
    lines = ["| method | forwards / image | FD ↓ | class acc. | speed-up (batch 1) | samples |",
             "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        if r["run"] != run or r["method"] == "reference":
            continue
        speed = f"{r['speedup_b1']:.2f}×" if r.get("speedup_b1") else "–"
        grid = f"![{r['entry']}](docs/results/image/{spec}/{r['grid']})" if r.get("grid") else ""
        lines.append(f"| `{r['entry']}` | {r['forwards_per_image']:.1f} | {r['fd']:.1f} | {pct(r['class_accuracy'])} "
                     f"| {speed} | {grid} |")
    return "\n" + "\n".join(lines) + "\n"


def show(path: Path) -> None:
    """Every configuration of a bench file with the speed model's terms (τ, speed-up, acceptance per draft position,
    c and v in the same run's baseline steps): what a doc about a drafter quotes, through the keys above."""
    table = file_table(path)
    for (suite, model, label), s in table.items():
        line = {"suite": suite, "model": model, "label": label, "items": s.items, "tau": round(s.tpf, 3),
                "speedup": None if s.speedup is None else round(s.speedup, 3)}
        if not s.is_baseline and s.draft_share is not None:
            for stat in ("draftcost", "verifycost", "accept")[0 if s.draft_forwards_per_item else 1:]:
                line[stat] = figure(table, f"{stat}|{suite}|{model}|{label}").rstrip("×")
        print(json.dumps(line, ensure_ascii=False))


def dlm_text(table: dict, label: str) -> str:
    parts = []
    for suite in ("parallel-lists", "puzzles"):
        s, b = get(table, suite, "zoo:dlm-small", label), baseline(table, suite, "zoo:dlm-small")
        parts.append(f"`{suite}`: accuracy {pct(s.accuracy)} (baseline {pct(b.accuracy)}), TPF {s.tpf:.2f}, "
                     f"{b.forwards_per_item / s.forwards_per_item:.2f}× fewer forwards, {s.speedup:.2f}× tokens/s, "
                     f"same tokens as the baseline on {100 * (s.equal_rate or 0):.0f} % of items")
    return "; ".join(parts)


def dlm_baseline_text(table: dict) -> str:
    a, b = (baseline(table, s, "zoo:dlm-small") for s in ("parallel-lists", "puzzles"))
    return f"{pct(a.accuracy)} on `parallel-lists` and {pct(b.accuracy)} on `puzzles`, TPF {a.tpf:.2f} / {b.tpf:.2f}"


def spec_text(table: dict, label: str) -> str:
    return "; ".join(f"τ {s.tpf:.2f}, {s.speedup:.2f}× on `{suite}`"
                     for suite in ("parallel-lists", "code")
                     for s in [get(table, suite, "zoo:ar-small", label)])


def readme_table(table: dict) -> str:
    lines = ["| suite · model | method | accuracy | TPF | speed-up | = baseline |", "|---|---|---:|---:|---:|---:|"]
    for suite, model, labels, name in README_ROWS:
        ss = [get(table, suite, model, label) for label in labels]
        acc = " / ".join(pct(s.accuracy) for s in ss)
        tpf = " / ".join(f"{s.tpf:.2f}" for s in ss)
        speed = " / ".join(f"{s.speedup:.2f}×" for s in ss)
        equal = " / ".join(f"{100 * (s.equal_rate or 0):.0f} %" for s in ss)
        lines.append(f"| {suite} · {model.removeprefix('zoo:')} | {name} | {acc} | {tpf} | {speed} | {equal} |")
    return "\n" + "\n".join(lines) + "\n"


def card_text(spec: str) -> str:
    name, field = spec.split("|")
    card = (ROOT / "fastdecode" / "zoo" / name / "README.md").read_text(encoding="utf-8")
    found = CARD_JSON.search(card)
    if found is None:
        raise SystemExit(f"the card of {name} has no measured metrics")
    metrics = json.loads(found["json"])
    if field.startswith("acc@"):
        return pct(metrics["accuracy"][field[4:]])
    values = {"mean": lambda: pct(metrics["mean_deterministic_list_accuracy"]),
              "agreement": lambda: pct(metrics["greedy_agreement_with_ar_small"]),
              "minutes": lambda: f"{metrics['train_minutes']:.1f} min",
              "items": lambda: str(metrics["items_per_task"])}
    return pick(values, field, "card", spec, ' or acc@TASK')


def pick(values: dict[str, Callable[[], str]], field: str, what: str, spec: str, also: str = "") -> str:
    """The figure FIELD of a key's `values`, or a message naming the fields there are."""
    if field not in values:
        raise SystemExit(f"bad {what} figure {spec!r}: FIELD is one of {sorted(values)}{also}")
    return values[field]()


@functools.cache
def cost_rows(path: Path) -> list[dict]:
    """The rows of a file under docs/results/cost (forward-cost curves, copy bounds), read once per run."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def row_for(path: Path, field: str, value: str, rerun: str) -> dict:
    """The row of `path` whose `field` is `value` (the latest, where a tool appended several)."""
    rows = [r for r in cost_rows(path) if r[field] == value]
    if not rows:
        raise SystemExit(f"{path} has no row for {value}; rerun {rerun}")
    return rows[-1]


def cost_text(table: Table, spec: str) -> str:
    stem, width, field = spec.split("|")
    path = table.results / "cost" / f"{stem}.jsonl"
    rows = {r["width"]: r for r in cost_rows(path)}
    if int(width) not in rows:
        raise SystemExit(f"{path} has no forward of width {width}; rerun tools/forward_cost.py with it")
    row = rows[int(width)]
    values = {"ms": lambda: f"{row['median_ms']:.1f}", "ratio": lambda: f"{row['over_width_1']:.2f}×",
              "matmul": lambda: f"{100 * row['matmul_share']:.0f} %"}
    if field.startswith("bound@"):  # the speed-up a step of this width reaching tau tokens has at most
        return f"{float(field[6:]) / row['over_width_1']:.2f}×"
    return pick(values, field, "cost", spec, ' or bound@TAU')


def copy_bound_text(table: Table, spec: str) -> str:
    suite, field = spec.split("|")
    r = row_for(table.results / "cost" / "copy-bound.jsonl", "suite", suite, "`make results-bound`")
    values = {"speedup": lambda: f"{r['speedup_bound']:.2f}×", "tau": lambda: f"{r['tau_of_plan']:.2f}"}
    return pick(values, field, "copy-bound", spec)


def bf16_text(table: Table, spec: str) -> str:
    name, field = spec.split("|")
    r = row_for(table.results / "zoo" / "bf16.jsonl", "model", name, "`make results-zoo-bf16`")

    def changed() -> str:
        moved = [f"{t} {pct(a)} (card {pct(r['accuracy_card'][t])})" for t, a in r["accuracy_bf16"].items()
                 if a != r["accuracy_card"][t]]
        return ", ".join(moved) or "none"

    values = {"mean": lambda: pct(r["mean_bf16"]), "card_mean": lambda: pct(r["mean_card"]),
              "bpb": lambda: f"{r['code_bits_per_byte_bf16']:.4f}",
              "card_bpb": lambda: f"{r['code_bits_per_byte_card']:.4f}",
              "agreement": lambda: pct(r["greedy_agreement_with_ar_small_bf16"]),
              "card_agreement": lambda: pct(r["greedy_agreement_with_ar_small_card"]),
              "mb": lambda: f"{r['bf16_megabytes']:.1f} MB", "fp32_mb": lambda: f"{r['fp32_megabytes']:.1f} MB",
              "sim": lambda: pct(r["code_similarity_bf16"]), "card_sim": lambda: pct(r["code_similarity_card"]),
              "changed": changed, "items": lambda: str(r["items_per_task"]), "minutes": lambda: f"{r['minutes']:.1f}"}
    return pick(values, field, "bf16", spec)


@functools.cache
def engine_summaries(results: Path, name: str = "engine.jsonl") -> dict[str, Summary]:
    """An engine run's configurations by label (its own file: its rows must not pool with the suites' files)."""
    return {s.label: s for s in summarize(read_rows(results / "engine" / name))}


def engine_text(table: Table, spec: str, name: str = "engine.jsonl") -> str:
    label, field = spec.split("|")
    found = engine_summaries(table.results, name)
    if label not in found:
        raise SystemExit(f"no configuration {label!r} in docs/results/engine/{name}; known: {sorted(found)}")
    s = found[label]
    values = {"speedup": lambda: f"{s.speedup:.2f}×", "inverse": lambda: f"{1 / s.speedup:.2f}×",
              "tpf": lambda: f"{s.tpf:.2f}", "tps": lambda: f"{s.tokens_per_s:.0f}"}
    return pick(values, field, "engine", spec)


def batch_text(table: Table, spec: str) -> str:
    method, field = spec.split("|")
    r = row_for(table.results / "engine" / "batch.jsonl", "method", method, "`make results-engine`")
    values = {"speedup": lambda: f"{r['speedup']:.2f}×", "batched": lambda: f"{r['tokens_per_s_batched']:.0f}",
              "single": lambda: f"{r['tokens_per_s_one_by_one']:.0f}", "batch": lambda: str(r["batch"]),
              "equal": lambda: "equal" if r["equal_outputs"] else "NOT equal"}
    return pick(values, field, "batch", spec)


def step_text(table: Table, spec: str) -> str:
    variant, field = spec.split("|")
    r = row_for(table.results / "engine" / "step_bound.jsonl", "variant", variant, "`make results-engine`")
    values = {"x-generate": lambda: f"{r['speedup_vs_generate']:.2f}×", "ms": lambda: f"{r['ms_per_token']:.1f}",
              "cpu-x-generate": lambda: f"{r['cpu_speedup_vs_generate']:.2f}×",
              "cpu-ms": lambda: f"{r['cpu_ms_per_token']:.1f}", "equal": lambda: str(r["equal_to_generate"])}
    return pick(values, field, "step", spec)


def sparse_text(table: Table, spec: str) -> str:
    from statistics import mean, median

    part, context, method, budget, field = spec.split("|")
    rows = [r for r in cost_rows(table.results / "sparse" / f"{part}.jsonl")
            if r["method"] == method and (context == "all" or r["context"] == context)
            and (r["budget"] is None if budget == "-" else r["budget"] == int(budget))]
    if not rows:
        raise SystemExit(f"docs/results/sparse/{part}.jsonl has no rows for {spec!r}; rerun `make results-sparse`")
    if field.startswith("score@"):
        scores = [r["score"] for r in rows if r["task"].split("@")[0] == f"longctx.{field[6:]}"]
        if not scores:
            raise SystemExit(f"bad sparse figure {spec!r}: no task longctx.{field[6:]} in its rows")
        return pct(mean(scores))
    values = {"score": lambda: pct(mean(r["score"] for r in rows)),
              "agree": lambda: pct(mean(r["agree"] for r in rows)),
              "mb": lambda: f"{mean(r['kv_read_bytes_per_token'] for r in rows) / 1e6:.1f} MB",
              "speedup": lambda: f"{median(r['speedup'] for r in rows):.2f}×",
              "tps": lambda: f"{median(r['tokens_per_s'] for r in rows):.1f}",
              "identical": lambda: "yes" if all(r.get("identical", True) for r in rows) else "no"}
    return pick(values, field, "sparse", spec, " or score@OP")


def render(key: str, table: dict) -> str:
    kind, _, label = key.partition(":")
    if kind == "dlm":
        return dlm_text(table, label)
    if kind == "dlm-baseline":
        return dlm_baseline_text(table)
    if kind == "spec":
        return spec_text(table, label)
    if kind == "readme-table":
        return readme_table(table)
    if kind == "fig":
        return figure(table, label)
    if kind == "learned":
        return learned_text(label)
    if kind == "gpu":
        return learned_text(label, GPU)
    if kind == "learned-table":
        return learned_table_text(label)
    if kind == "image-table":
        return image_table_text(label)
    if kind == "answers":
        return answers_text(table, label)
    if kind == "loops":
        return loops_text(table, label)
    if kind == "card":
        return card_text(label)
    if kind == "cost":
        return cost_text(table, label)
    if kind == "copybound":
        return copy_bound_text(table, label)
    if kind == "bf16":
        return bf16_text(table, label)
    if kind == "engine":
        return engine_text(table, label)
    if kind == "batch":
        return batch_text(table, label)
    if kind == "llamacpp":
        return engine_text(table, label, "llamacpp.jsonl")
    if kind == "step":
        return step_text(table, label)
    if kind == "sparse":
        return sparse_text(table, label)
    raise SystemExit(f"unknown figure key {key!r}")


def read_names(path: Path = FIGURES) -> dict[str, str]:
    """The short names docs/figures.txt defines: NAME -> KEY."""
    names: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, eq, key = (part.strip() for part in line.partition("="))
        if not eq or not name or not key or any(c in name for c in " |:"):
            raise SystemExit(f"{path}:{number}: expected `NAME = KEY` with a NAME free of spaces, '|' and ':'")
        if name in names:
            raise SystemExit(f"{path}:{number}: {name!r} is defined twice")
        names[name] = key
    return names


def resolve_name(name: str, names: dict[str, str]) -> str:
    if name not in names:
        raise SystemExit(f"unknown figure name {name!r}: define it in {FIGURES.relative_to(ROOT)} as `{name} = KEY`")
    return names[name]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument("--check", action="store_true", help="fail if a span is out of date; write nothing")
    parser.add_argument("--show", type=Path, metavar="FILE",
                        help="print each configuration's τ, speed-up, c, v and acceptance per draft position in a "
                             "bench file, and exit")
    args = parser.parse_args()
    if args.show:
        show(args.show)
        return 0
    table = load(args.results)
    names = read_names()
    values = {name: render(key, table) for name, key in names.items()}  # every defined figure must compute
    def fill(m: re.Match) -> str:
        resolve_name(m["key"], names)  # a name quoted but not defined fails here
        return f"<!--m {m['key']}-->{values[m['key']]}<!--/m-->"

    stale, quoted = [], set()
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        quoted |= {m["key"] for m in SPAN.finditer(text)}
        new = SPAN.sub(fill, text)
        if new != text:
            stale.append(doc.relative_to(ROOT))
            if not args.check:
                doc.write_text(new, encoding="utf-8")
    unused = sorted(set(names) - quoted)
    if unused:
        print(f"defined in {FIGURES.relative_to(ROOT)} but quoted nowhere: {', '.join(unused)}", file=sys.stderr)
        return 1
    if args.check and stale:
        print(f"out of date: {', '.join(map(str, stale))}; run `make docs-figures`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
