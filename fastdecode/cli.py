"""The command line: thin subcommands over the library. Only the CLI prints."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import sys
import traceback
import warnings
from typing import Annotated, Any, NoReturn, Optional

import typer
from rich.console import Console
from rich.table import Table

from .cli_dd import add_dd_commands
from .cli_train import one_phase, settings, training_bar

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Fast decoding for language models, measured one way."
)
PIPE_WIDTH = 4096  # columns of output that goes to a pipe or a log: tables are never cut there, lines never wrapped


def _console(stderr: bool = False) -> Console:
    """A console that keeps rich's width on a terminal, and elsewhere (a pipe, a log) is wide enough that no
    table cell is cut to fit 80 columns; COLUMNS, when set, wins."""
    console = Console(stderr=stderr)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPE_WIDTH
    return console


out = _console()
err = _console(stderr=True)

def _print_version(value: bool) -> None:
    if value:
        from fastdecode import __version__

        out.print(f"fastdecode {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main_options(
    version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True, help="Print the version and exit.")] = False,
) -> None:
    """Fast decoding for language models, measured one way."""


ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Model folder or zoo:NAME.")]
RemoteOpt = Annotated[
    bool, typer.Option("--trust-remote-code", help="Run modelling code shipped in the model folder (LLaDA, Dream).")
]
DeviceOpt = Annotated[Optional[str], typer.Option(help="cpu, cuda, cuda:1 ... (default: cuda if present).")]
KindOpt = Annotated[
    Optional[str],
    typer.Option("--kind", help="causal or diffusion: overrides what config.json says (default: detected)."),
]
DtypeOpt = Annotated[
    Optional[str], typer.Option(help="float32, bfloat16 or float16 (default: bf16 on CUDA, fp32 on CPU).")
]
ExactOpt = Annotated[Optional[bool], typer.Option(
    "--exact/--no-exact", help="Every forward at one shape, so lossless methods equal their baseline token for "
    "token in bfloat16/float16 (default: on for CUDA in low precision; docs/gpu.md).")]
GraphsOpt = Annotated[Optional[bool], typer.Option(
    "--graphs/--no-graphs", help="CUDA graphs of exact mode's forwards, or of a diffusion model's canvas forwards "
    "(default: on wherever exact mode is on CUDA; for diffusion models on CUDA; docs/gpu.md).")]
FusedOpt = Annotated[Optional[bool], typer.Option(
    "--fused/--no-fused", help="The layers' elementwise runs compiled into fused kernels (torch.compile; causal "
    "models with the direct forward, the zoo's diffusion models; default: on with CUDA graphs on CUDA; docs/gpu.md).")]
ThreadsOpt = Annotated[Optional[int], typer.Option(
    help="torch CPU threads (default: 1 for a model under 50 M parameters on the CPU, else torch's choice; "
    "docs/cli.md); recorded in bench's rows.")]
DraftOpt = Annotated[
    Optional[str],
    typer.Option(help="Draft model folder or zoo:NAME, for methods that take one (a diffusion LM for spec.dlm_draft)."),
]


@app.command()
def generate(
    model: ModelOpt,
    prompt: Annotated[list[str], typer.Option("--prompt", "-p", help="Prompt text; repeat for a batch.")],
    method: Annotated[str, typer.Option(help="Registered method, see `fastdecode methods`.")] = "ar.greedy",
    param: Annotated[list[str], typer.Option("--param", help="Method parameter name=value; repeatable.")] = [],  # noqa: B006
    max_new_tokens: Annotated[Optional[int], typer.Option(help="Shortcut for --param max_new_tokens=N.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print results as JSON lines.")] = False,
    draft: DraftOpt = None,
    trust_remote_code: RemoteOpt = False,
    kind: KindOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    exact: ExactOpt = None,
    graphs: GraphsOpt = None,
    fused: FusedOpt = None,
    constraint_json_schema: Annotated[Optional[str], typer.Option(
        help="Output must be JSON matching the JSON schema in this file.")] = None,
    constraint_regex: Annotated[Optional[str], typer.Option(help="Output must match this regular expression.")] = None,
    constraint_grammar: Annotated[Optional[str], typer.Option(
        help="Output must be a sentence of the grammar (Lark or GBNF) in this file.")] = None,
    constraint_sampling: Annotated[str, typer.Option(
        help="mask, or gad (Grammar-Aligned Decoding) for sampled methods.")] = "mask",
    constraint_diffusion: Annotated[str, typer.Option(help="dlm.* rule: lave or prefix.")] = "lave",
    threads: ThreadsOpt = None,
    image_out: Annotated[Optional[str], typer.Option(
        "--out", help="Image models: write each picture to this PNG (NAME-1.png, NAME-2.png ... for a batch), "
                      "every pixel as 4x4.")] = None,
    cfg_scale: Annotated[Optional[float], typer.Option(
        help="Image models: classifier-free guidance (1 = none; default: the model's image.json).")] = None,
) -> None:
    """Generate text (or, with an image model, a picture per class label) with a method and print it with a
    one-line stats summary."""
    import fastdecode
    from fastdecode import constraints
    from fastdecode.config import parse_param_strings

    params: dict[str, object] = dict(parse_param_strings(param))
    if max_new_tokens is not None:
        params["max_new_tokens"] = max_new_tokens
    if cfg_scale is not None:
        params["cfg_scale"] = cfg_scale
    fastdecode.get_method(method)  # fail on a bad method name before loading the model
    given = [x for x in (constraint_json_schema, constraint_regex, constraint_grammar) if x is not None]
    if len(given) > 1:
        raise constraints.ConstraintError("Give one of --constraint-json-schema, --constraint-regex and "
                                          "--constraint-grammar, not several.")
    options: dict[str, object] = {"sampling": constraint_sampling, "diffusion": constraint_diffusion}
    if constraint_json_schema is not None:
        params["constraint"] = constraints.from_file("json_schema", constraint_json_schema, **options)
    elif constraint_grammar is not None:
        params["constraint"] = constraints.from_file("grammar", constraint_grammar, **options)
    elif constraint_regex is not None:
        params["constraint"] = constraints.regex(constraint_regex, **options)
    _use_threads(model, threads, device)
    with err.status(f"loading {model}"):
        m = fastdecode.load(model, kind=kind, device=device, dtype=dtype, trust_remote_code=trust_remote_code,
                            **_exact_kwargs(exact, graphs, fused))
        d = (fastdecode.load(draft, device=m.device, dtype=m.dtype, trust_remote_code=trust_remote_code)
             if draft else None)
    if image_out is not None and getattr(m, "image", None) is None:
        from fastdecode.errors import ArgumentError

        raise ArgumentError(f"--out writes an image model's pictures, and {model} is a text model: leave --out out.")
    results = fastdecode.generate(m, list(prompt), method, draft=d, **params)
    if image_out is not None:
        _write_pictures(image_out, results)
    for r in results:
        if as_json:
            row: dict[str, object] = {"text": r.text, "token_ids": r.token_ids, "method": r.method,
                                      "stats": r.stats.to_dict()}
            if r.constraint_complete is not None:
                row["constraint_complete"] = r.constraint_complete
            _write_line(json.dumps(row))  # one line per result, whatever the width
        else:
            if r.image is None:  # an image model's output is its picture (--out), not text
                out.print(r.text, markup=False, highlight=False)
            err.print(f"[dim]{r.method}: {r.stats.summary()} · {_threads_in_use()}[/dim]")
        if r.constraint_complete is False:
            err.print(f"warning: max_new_tokens ({r.stats.new_tokens}) cut the output before the constraint was "
                      "complete: it is a valid prefix, not a valid output; raise --max-new-tokens.",
                      markup=False, highlight=False, soft_wrap=True)


def _write_pictures(path: str, results: list[Any]) -> None:
    """Each result's picture as a PNG: `path` itself for one, NAME-1.png, NAME-2.png ... for several."""
    from pathlib import Path

    from fastdecode.image.png import write_png

    target = Path(path)
    for i, r in enumerate(results, 1):
        where = target if len(results) == 1 else target.with_name(f"{target.stem}-{i}{target.suffix or '.png'}")
        write_png(where, r.image, scale=4)
        err.print(f"wrote {where}", highlight=False)


@app.command()
def methods(kind: Annotated[Optional[str], typer.Option(help="causal or diffusion")] = None) -> None:
    """List registered methods with their description and parameters."""
    import fastdecode

    table = Table(title="fastdecode methods")
    for col in ("method", "model", "lossless", "description", "parameters (defaults)"):
        table.add_column(col, overflow="fold")
    for m in fastdecode.methods(kind):
        params = ", ".join(f"{n}={d}" for n, d in m.params())
        missing = m.missing()
        needs = f" [not installed: pip install {' '.join(missing)}]" if missing else ""
        table.add_row(m.name, m.kind, "yes" if m.lossless else "", m.description + needs, params)
    out.print(table)


@app.command()
def info(
    model: Annotated[str, typer.Argument(help="Model folder or zoo:NAME.")],
    trust_remote_code: RemoteOpt = False,
    kind: KindOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
) -> None:
    """Show a model's kind, size, vocabulary and special tokens."""
    import fastdecode

    m = fastdecode.load(model, kind=kind, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
    table = Table(show_header=False, title=model)
    for k, v in m.describe().items():
        table.add_row(k, f"{v:,}" if isinstance(v, int) else str(v))
    out.print(table)


def _use_threads(model: str, threads: int | None, device: str | None) -> int | None:
    """Set torch's CPU threads for generate, bench or serve on `model`: --threads, else the size rule of
    `fastdecode.models.threads` (one thread for a small model on the CPU). Returns what was set; None: torch's
    choice stands."""
    _check_threads(threads)
    import torch

    from fastdecode.models.threads import cli_threads

    chosen = cli_threads(model, threads, device)
    if chosen is not None:
        torch.set_num_threads(chosen)
    return chosen


def _threads_in_use() -> str:
    import torch

    n = torch.get_num_threads()
    return f"{n} torch thread{'' if n == 1 else 's'}"


def _progress_bar():
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    class ProgressBar(Progress):
        def __exit__(self, exc_type, exc_val, exc_tb) -> None:
            if exc_type is None:
                super().__exit__(exc_type, exc_val, exc_tb)
            else:  # an error's one line is the last word: no final bar (nor Progress.stop's empty line) in a log
                self.live.transient = True
                self.live.stop()

    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    return ProgressBar(*columns, console=err)


def _check_threads(threads: int | None) -> None:
    """Refuse a --threads value torch refuses (with a bare RuntimeError, for 0 or less)."""
    from fastdecode.errors import ArgumentError

    if threads is not None and threads < 1:
        raise ArgumentError(f"--threads must be at least 1, not {threads}.")


def _heads_folder(out_dir: str | None, target: str, name: str, what: str) -> str:
    """A training command's --out, or for a zoo target the package's zoo/MODEL/heads/NAME, where the methods find the
    trained part with no flag; a target outside the zoo needs --out."""
    from fastdecode.errors import ArgumentError

    if out_dir is not None:
        return out_dir
    if not target.startswith("zoo:"):
        raise ArgumentError(f"--out is needed for a target outside the zoo ({target!r}): name the {what}'s folder.")
    from fastdecode.train.zoo import zoo_folder

    return str(zoo_folder(target[4:]) / "heads" / name)


def _exact_kwargs(exact: bool | None, graphs: bool | None = None, fused: bool | None = None) -> dict[str, bool]:
    """`load`'s exact=, graphs= and fused= from --exact/--no-exact, --graphs/--no-graphs and --fused/--no-fused (none:
    the device's default, so load is called as before)."""
    return {**({} if exact is None else {"exact": exact}), **({} if graphs is None else {"graphs": graphs}),
            **({} if fused is None else {"fused": fused})}


def _command(name: str, *args: str, **options) -> str:
    """The canonical command line for a run, written into results and reports so that they can be reproduced."""
    import shlex

    parts = ["fastdecode", name, *args]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            parts.append(flag)
        elif isinstance(value, (list, tuple)):
            if value and key == "param":
                parts += [a for v in value for a in (flag, v)]
            elif value:
                parts += [flag, *map(str, value)]
        elif value not in (None, False):
            parts += [flag, str(value)]
    return shlex.join(parts)


def _describe(progress) -> str:
    job = progress.job
    what = f"{job.method} · {job.task.name}" if job is not None else ""
    return f"warm-up {what}" if progress.phase == "warmup" else what


def _print_summaries(summaries, title: str) -> None:
    """One table per (suite, model), baseline first."""
    groups: dict[tuple[str, str], list] = {}
    for s in summaries:
        groups.setdefault((s.suite, s.model), []).append(s)
    for (suite, model), group in groups.items():
        table = Table(title=f"{title}\n{suite} · {model}")
        for col in ("method", "accuracy", "TPF", "fwd/item", "tok/s", "speed-up", "= base", "items"):
            table.add_column(col, justify="left" if col == "method" else "right")
        for s in group:
            table.add_row(s.label + (" (baseline)" if s.is_baseline else ""), f"{s.accuracy:.0%}", f"{s.tpf:.2f}",
                          f"{s.forwards_per_item:.1f}", f"{s.tokens_per_s:.0f}",
                          f"{s.speedup:.2f}×" if s.speedup else "—",
                          f"{s.equal_rate:.0%}" if s.equal_rate is not None else "—", str(s.items))
        out.print(table)


@app.command()
def bench(
    suite: Annotated[str, typer.Option(help="Suite: parallel-lists, puzzles, code, structured, quick, longctx (1k, "
                                             "2k and 4k tokens), longctx-1k, longctx-2k, longctx-4k, longctx-8k or "
                                             "longctx-16k (docs/bench.md).")],
    model: ModelOpt,
    methods: Annotated[list[str], typer.Option(
        "--methods", help="Methods to run: --methods m1 m2 ... (the baseline is added); m:name=value,... is a "
        "configuration of its own, e.g. dlm.baseline:cache=dual.")],
    out_path: Annotated[str, typer.Option("--out", help="Results JSONL; re-running with the same file resumes it.")],
    draft: DraftOpt = None,
    param: Annotated[
        list[str], typer.Option("--param", help="method.name=value, e.g. ar.sample.seed=1; repeatable.")
    ] = [],  # noqa: B006
    limit: Annotated[Optional[int], typer.Option(help="At most N items per task.")] = None,
    seeds: Annotated[
        Optional[list[int]],
        typer.Option("--seeds", help="Test seeds (>= 1000000) to draw items from: --seeds S1 S2 ..."),
    ] = None,
    warmup: Annotated[bool, typer.Option(help="One unrecorded generation per method first.")] = True,
    threads: ThreadsOpt = None,
    ray: Annotated[Optional[str], typer.Option(
        "--ray", help="Run the jobs on a Ray cluster: --ray (RAY_ADDRESS, else a local one) or --ray ADDRESS "
        "(auto, ray://HEAD:10001); needs fastdecode[ray].")] = None,
    ray_workers: Annotated[
        Optional[int], typer.Option(help="Ray workers (default: one per GPU, else one per --threads CPUs).")
    ] = None,
    trust_remote_code: RemoteOpt = False,
    kind: KindOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    exact: ExactOpt = None,
    graphs: GraphsOpt = None,
    fused: FusedOpt = None,
) -> None:
    """Run methods on a suite's test items, one generation at a time, one JSONL row each (resumable)."""
    import fastdecode
    from fastdecode.bench.harness import check_out, read_rows, run_bench, split_params
    from fastdecode.bench.report import summarize
    from fastdecode.bench.suites import get_suite

    get_suite(suite)  # an unknown suite is refused before any model loads (--kind loads the target here)
    _check_threads(threads)
    check_out(out_path)  # before the progress bar, so that the error is the only line
    threads = _use_threads(model, threads, device)  # a default it set goes into the recorded command too
    command = _command("bench", suite=suite, model=model, draft=draft, methods=methods, param=param, limit=limit,
                       seeds=seeds, out=out_path, threads=threads, kind=kind, device=device, dtype=dtype,
                       no_warmup=not warmup, trust_remote_code=trust_remote_code, ray=ray, ray_workers=ray_workers,
                       exact=exact is True, no_exact=exact is False,
                       graphs=graphs is True, no_graphs=graphs is False, fused=fused is True, no_fused=fused is False)
    load_kwargs = {"device": device, "dtype": dtype, "trust_remote_code": trust_remote_code,
                   **_exact_kwargs(exact, graphs, fused)}
    with _progress_bar() as bar:
        task = bar.add_task(f"loading {model}", total=None)

        def on_progress(p) -> None:
            bar.update(task, total=p.total, completed=p.done, description=_describe(p))

        try:
            # --kind is the target's (a draft's kind is detected): load the target here when it is given
            target = (fastdecode.load(model, kind=kind, device=device, dtype=dtype, trust_remote_code=trust_remote_code,
                                      **_exact_kwargs(exact, graphs, fused))
                      if kind else model)
            summary = run_bench(suite, target, methods, out_path, draft=draft, params=split_params(param), seeds=seeds,
                                limit=limit, warmup=warmup, command=command, load_kwargs=load_kwargs,
                                on_progress=on_progress, ray=ray is not None,
                                ray_address=None if ray in (None, RAY_DEFAULT) else ray, ray_workers=ray_workers)
        except KeyboardInterrupt:
            bar.stop()
            err.print(f"interrupted: the rows finished so far are in {out_path}; run the same command again to resume.")
            global _interrupt_told
            _interrupt_told = True
            raise typer.Exit(130) from None
    rows = [r for r in read_rows(out_path) if r["suite"] == suite and r["model"] == model]
    _print_summaries(summarize(rows), "this file, this machine")
    err.print(f"{summary.written} rows written, {summary.skipped} already there: {out_path}. "
              f"Full report: fastdecode report {out_path} --plots DIR")


@app.command("bench-image")
def bench_image(
    model: ModelOpt,
    out_dir: Annotated[str, typer.Option("--out", help="Folder of samples.jsonl, metrics.jsonl, grids/ and report.md "
                                                       "(appended to: each invocation is one run).")],
    methods: Annotated[list[str], typer.Option(
        "--methods", help="Methods beside the baseline ar.sample: --methods m1 m2 ...; m:name=value,... is a "
        "configuration of its own.")] = [],  # noqa: B006
    param: Annotated[
        list[str], typer.Option("--param", help="method.name=value, e.g. ar.sample.cfg_scale=2; repeatable.")
    ] = [],  # noqa: B006
    per_class: Annotated[int, typer.Option(help="Images of each class per method (the quality metrics' N / 10).")]
    = 20,
    seed: Annotated[int, typer.Option(help="The run's seed (each class's batches draw from it).")] = 0,
    batch: Annotated[int, typer.Option(help="Images generated together for the quality metrics.")] = 64,
    latency_images: Annotated[int, typer.Option(help="Images timed one by one (batch 1).")] = 10,
    throughput_batch: Annotated[int, typer.Option(help="The batch timed for wall time per image.")] = 64,
    independent: Annotated[bool, typer.Option(
        help="Also the independent baseline (per-position class marginals of the train codes).")] = True,
    evaluator: Annotated[Optional[str], typer.Option(
        help="Evaluator folder (default: the shipped fastdecode/zoo/img-eval).")] = None,
    threads: ThreadsOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
) -> None:
    """Class-conditional image generation, scored: FD, KID, class accuracy, precision/recall, teacher NLL, forwards
    and wall time per image at batch 1 and batch 64, per method beside ar.sample in the same run (docs/image.md)."""
    import fastdecode
    from fastdecode.bench.harness import split_params
    from fastdecode.bench.imagegen import ImageBenchConfig, run_image_bench
    from fastdecode.image.evaluator import load_evaluator

    _check_threads(threads)
    cfg = ImageBenchConfig(per_class=per_class, seed=seed, batch=batch, latency_images=latency_images,
                           throughput_batch=throughput_batch)
    cfg.check()
    judge = load_evaluator(evaluator)  # a missing evaluator is refused before the model loads
    threads = _use_threads(model, threads, device)
    command = _command("bench-image", model=model, methods=methods, param=param, per_class=per_class, seed=seed,
                       batch=batch, latency_images=latency_images, throughput_batch=throughput_batch,
                       no_independent=not independent, evaluator=evaluator, out=out_dir, threads=threads,
                       device=device, dtype=dtype)
    with _progress_bar() as bar:
        task = bar.add_task(f"loading {model}", total=None)
        target = fastdecode.load(model, device=device, dtype=dtype)

        def on_progress(phase: str, done: int, total: int) -> None:
            bar.update(task, total=total, completed=done, description=phase)

        summary = run_image_bench(target, methods, out_dir, params=split_params(param), cfg=cfg, evaluator=judge,
                                  independent=independent, command=command, on_progress=on_progress)
    for row in summary.metrics:
        if row["method"] == "reference":
            continue
        err.print(f"{row['entry']}: {row['forwards_per_image']:.1f} forwards/image, FD {row['fd']:.2f}, "
                  f"KID {row['kid']:.4f}, class acc {100 * row['class_accuracy']:.1f}%, P {row['precision']:.2f} "
                  f"R {row['recall']:.2f}, NLL/token {row['nll_per_token']:.3f}", highlight=False)
    err.print(f"report: {summary.report} · grids: {summary.out_dir / 'grids'}", highlight=False)


@app.command()
def report(
    files: Annotated[list[str], typer.Argument(help="Results JSONL files from `fastdecode bench`.")],
    out_path: Annotated[
        Optional[str], typer.Option("--out", help="Write the Markdown here (e.g. docs/RESULTS.md).")
    ] = None,
    plots: Annotated[Optional[str], typer.Option(help="Folder for the PNG plots.")] = None,
) -> None:
    """Tables (accuracy, TPF, tokens/s, speed-up, = baseline), the leaderboard figure and plots from bench results."""
    from rich.markdown import Markdown

    from fastdecode.bench.report import build_report

    command = _command("report", *files, out=out_path, plots=plots)
    result = build_report(files, out=out_path, plots_dir=plots, command=command)
    if out_path is not None:
        pass  # the report is in the file; the lines below say where
    elif out.is_terminal:
        out.print(Markdown(result.markdown))
    else:
        _write_line(result.markdown)
    for path in [*([out_path] if out_path else []), *map(str, result.plots)]:
        err.print(f"wrote {path}")


@app.command()
def demo(
    limit: Annotated[Optional[int], typer.Option(help="At most N items per task (default: the quick suite's).")] = None,
    out_dir: Annotated[
        str, typer.Option("--out", help="Folder for results.jsonl, report.md and the plots.")
    ] = "runs/demo",
    resume: Annotated[
        bool, typer.Option(help="Keep the rows of an earlier demo run instead of measuring again.")
    ] = False,
) -> None:
    """Run the quick suite on the bundled zoo models with the baselines and reference methods; print the table."""
    from fastdecode.bench.demo import require_models, run_demo, run_demo_images, zoo_plan

    plan, notes = zoo_plan()
    for note in notes:
        err.print(f"[yellow]skipped:[/yellow] {note}", highlight=False)
    require_models(plan)
    for m in plan:  # the thread rule of generate, bench and serve (every zoo model is small: one thread)
        _use_threads(m.model, None, None)
    with _progress_bar() as bar:
        tasks: dict[str, object] = {}

        def on_progress(m, p) -> None:
            if m.model not in tasks:
                tasks[m.model] = bar.add_task(m.model, total=p.total)
            bar.update(tasks[m.model], total=p.total, completed=p.done, description=f"{m.model} · {_describe(p)}")

        result = run_demo(plan, out_dir, limit=limit, fresh=not resume, on_progress=on_progress)
    _print_summaries(result.report.summaries, "fastdecode demo: held-out test items, batch size 1, this machine")
    err.print(f"results: {result.results} · report: {result.report_path} · plots: "
              + ", ".join(str(p) for p in result.report.plots), highlight=False)
    with _progress_bar() as bar:
        task = bar.add_task("zoo:img-ar · image methods", total=None)
        images, image_notes = run_demo_images(out_dir, fresh=not resume)
        bar.update(task, total=1, completed=1)
    for note in image_notes:
        err.print(f"[yellow]skipped:[/yellow] {note}", highlight=False)
    if images is not None:
        table = Table(title="fastdecode demo: zoo:img-ar, 4 images a class per method, this machine")
        for column in ("method", "forwards / image", "class acc.", "speed-up (batch 1)", "samples"):
            table.add_column(column)
        for r in images.metrics[1:]:
            table.add_row(r["entry"], f"{r['forwards_per_image']:.1f}", f"{100 * r['class_accuracy']:.0f} %",
                          f"{r['speedup_b1']:.2f}×" if r.get("speedup_b1") else "–", str(images.out_dir / r["grid"]))
        out.print(table)
        err.print(f"image report: {images.report}", highlight=False)


train_app = typer.Typer(
    no_args_is_help=True,
    help="Train a zoo model from its recipe (fastdecode train NAME), a drafter head against a target model "
         "(fastdecode train drafter --target MODEL --kind KIND), or zoo:dlm-small-dparallel (fastdecode train "
         "dparallel).",
)
app.add_typer(train_app, name="train")
add_dd_commands(train_app, err, out)  # train dd1, train dd2 (cli_dd.py)

OutOpt = Annotated[Optional[str], typer.Option("--out", help="Output folder (default: the package's zoo/NAME).")]
SeedOpt = Annotated[int, typer.Option(help="Training seed.")]
TrainThreadsOpt = Annotated[int, typer.Option(help="torch CPU threads (results depend on it).")]
StepsOpt = Annotated[Optional[int], typer.Option(help="Override the recipe's step count (for trials).")]
SetOpt = Annotated[list[str], typer.Option("--set", help="Override a recipe field for a trial, e.g. --set lr=0.002.")]
EvalOpt = Annotated[int, typer.Option(help="Test items per task for the model card.")]
ZOO_MODELS = {  # what `fastdecode train NAME` builds: the recipes of train/recipes.py, and ar-long's stages
    "ar-small": "the zoo's Llama-shaped causal LM (10 M parameters)",
    "ar-tiny": "the small draft model of zoo:ar-small (ar-small's tokenizer)",
    "dlm-small": "the zoo's masked-diffusion LM",
    "ar-long": "zoo:ar-small fine-tuned in stages to a 4k context (fastdecode/train/long.py)",
}


def _zoo_command(name: str, what: str) -> None:
    def command(out_dir: OutOpt = None, seed: SeedOpt = 0, threads: TrainThreadsOpt = 1, steps: StepsOpt = None,
                set_: SetOpt = [], eval_items: EvalOpt = 50) -> None:  # noqa: B006
        _train_zoo(name, out_dir, seed, threads, steps, set_, eval_items)

    command.__doc__ = f"Reproduce zoo:{name}, {what}, from its recipe and a seed; evaluate it and write its card."
    train_app.command(name)(command)


for _name, _what in ZOO_MODELS.items():
    _zoo_command(_name, _what)


@train_app.command("drafter")
def train_drafter(
    target: Annotated[str, typer.Option(help="The frozen target model: a folder or zoo:NAME.")],
    kind: Annotated[str, typer.Option(help="Head kind: medusa, hydra, eagle3, dflash ... (one objective a kind, "
                                           "fastdecode/train/objectives/).")],
    out_dir: Annotated[Optional[str], typer.Option(
        "--out", help="Output folder; the checkpoint there is resumed (default for a zoo target: the package's "
                      "zoo/MODEL/heads/KIND, the head its methods find with no flag).")] = None,
    seed: SeedOpt = 0,
    threads: TrainThreadsOpt = 1,
    steps: Annotated[Optional[int], typer.Option(help="Training steps (default: the loop's, 600).")] = None,
    set_: Annotated[list[str], typer.Option(
        "--set", help="A training setting (lr, batch_tokens, items, warmup, ...: fastdecode/train/heads.py, "
                      "HeadTraining) or a head option (e.g. num_heads=4), as NAME=VALUE.")] = [],  # noqa: B006
    device: DeviceOpt = None,
) -> None:
    """Train a drafter head against a frozen target on its own greedy answers; write it with its card.

    The target first regenerates its answers on training seeds of the zoo tasks (batched greedy decoding, cached and
    shared by every kind), then the head trains with AdamW; the run is resumable (rerun the same command) and
    deterministic for a seed and thread count. The card states the training time, the tokens and the τ per draft
    position measured with the method that decodes with the head."""
    from pathlib import Path

    import fastdecode
    from fastdecode.config import parse_param_strings
    from fastdecode.train.heads import split_settings, train_head
    from fastdecode.train.objectives import head_objective

    _check_threads(threads)
    head_objective(kind)  # an unknown kind is refused before the model loads
    cfg, options = split_settings(parse_param_strings(set_))
    if steps is not None:
        cfg = dataclasses.replace(cfg, steps=steps)
    out_dir = _heads_folder(out_dir, target, kind, "head")
    import torch

    torch.set_num_threads(threads)
    model = fastdecode.load(target, device=device, dtype="float32")
    command = (f"fastdecode train drafter --target {target} --kind {kind} --seed {seed} --threads {threads}"
               + (f" --steps {steps}" if steps else "") + "".join(f" --set '{s}'" for s in set_))
    bar, report = training_bar(err, {"data": f"regenerating {target}'s answers", "train": f"training the {kind} head",
                                     "measure": "measuring τ on parallel-lists"}, shown=("loss", "acc0", "acc1"))
    with bar:
        card = train_head(model, kind, Path(out_dir), seed=seed, cfg=cfg, options=options, report=report,
                          command=command, threads=threads)
    out.print_json(json.dumps(card))
    err.print(f"saved {out_dir} (card: {Path(out_dir) / 'README.md'})")


@train_app.command("img-vq")
def train_img_vq(out_dir: Annotated[Optional[str], typer.Option(
                     "--out", help="Output folder; its checkpoint is resumed (default: the package's zoo/img-ar/vq).")]
                 = None, seed: SeedOpt = 0, threads: TrainThreadsOpt = 1, steps: StepsOpt = None,
                 set_: SetOpt = []) -> None:  # noqa: B006
    """Train the VQ image tokenizer of zoo:img-ar (MNIST-5k, 7x7 codes of 64); resumable; writes its card."""
    from fastdecode.train.img_vq import VQTraining, train_vq

    _train_image("img-vq", VQTraining, train_vq, "vq", out_dir, seed, threads, steps, set_)


@train_app.command("img-ar")
def train_img_ar(out_dir: Annotated[Optional[str], typer.Option(
                     "--out", help="Output folder, holding the VQ in vq/; its checkpoint is resumed (default: the "
                                   "package's zoo/img-ar).")] = None,
                 seed: SeedOpt = 0, threads: TrainThreadsOpt = 1, steps: StepsOpt = None,
                 set_: SetOpt = []) -> None:  # noqa: B006
    """Train the class-conditional image teacher zoo:img-ar over the VQ's codes; resumable; writes its card."""
    from fastdecode.train.img_ar import ARTraining
    from fastdecode.train.img_ar import train_img_ar as trainer

    _train_image("img-ar", ARTraining, trainer, "", out_dir, seed, threads, steps, set_)


def _train_image(name: str, settings: Any, trainer: Any, default: str, out_dir: str | None, seed: int, threads: int,
                 steps: int | None, set_: list[str]) -> None:
    """Run an image trainer (fastdecode/train/img_*.py) with a progress bar; print its card's metrics."""
    from pathlib import Path

    import torch

    from fastdecode.config import build_config, parse_param_strings
    from fastdecode.train.zoo import zoo_folder

    _check_threads(threads)
    torch.set_num_threads(threads)
    overrides: dict[str, Any] = dict(parse_param_strings(set_))
    if steps is not None:
        overrides["steps"] = steps
    cfg = build_config(settings, overrides, name)
    folder = Path(out_dir) if out_dir else zoo_folder("img-ar") / default if default else zoo_folder("img-ar")
    command = (f"fastdecode train {name} --seed {seed} --threads {threads}" + (f" --steps {steps}" if steps else "")
               + "".join(f" --set '{s}'" for s in set_))
    bar, report = training_bar(err, {"train": f"training {name}"})
    with bar:
        metrics = trainer(folder, seed=seed, cfg=cfg, progress=one_phase(report), command=command, threads=threads)
    out.print_json(json.dumps(metrics))
    err.print(f"saved {folder} (card: {folder / 'README.md'})")

@train_app.command("filter")
def train_filter_command(
    target: Annotated[str, typer.Option(help="The masked-diffusion model: a folder or zoo:NAME.")] = "zoo:dlm-small",
    out_dir: Annotated[Optional[str], typer.Option(
        "--out", help="Output folder; its checkpoint is resumed (default for a zoo model: the package's "
                      "zoo/MODEL/heads/learn2pd, the filter dlm.learn2pd finds with no flag).")] = None,
    seed: SeedOpt = 0,
    threads: TrainThreadsOpt = 1,
    set_: Annotated[list[str], typer.Option(
        "--set", help="A setting of fastdecode/train/filter.py's FilterTraining (items, steps, lr, width, ...), "
                      "as NAME=VALUE.")] = [],  # noqa: B006
) -> None:
    """Train Learn2PD's filter on a diffusion model's own dlm.baseline trajectories; write it with its card.

    The model first decodes training-seed items of the list, letter and puzzle tasks with dlm.baseline, logging the
    filter's features at every step (kept task by task), then the filter trains with AdamW; rerunning the same
    command resumes. The card states the filter's held-out accuracy and precision and dlm.learn2pd's accuracy and
    TPF beside dlm.baseline and dlm.threshold on test items."""
    from pathlib import Path

    import fastdecode
    from fastdecode.train.checkpoint import clear_checkpoint
    from fastdecode.train.filter import FilterTraining, train_filter
    from fastdecode.train.filter_card import METHODS, measure_decoding, write_card

    _check_threads(threads)
    cfg = settings(FilterTraining, set_, "the filter's training (FilterTraining)")
    out_dir = _heads_folder(out_dir, target, "learn2pd", "filter")
    import torch

    torch.set_num_threads(threads)
    model = fastdecode.load(target, device="cpu", dtype="float32")
    command = (f"fastdecode train filter --target {target} --seed {seed} --threads {threads}"
               + "".join(f" --set '{s}'" for s in set_))
    bar, report = training_bar(err, {"data": f"logging {target}'s dlm.baseline trajectories (tasks)",
                                     "train": "training the filter", "measure": "decoding test items (methods)"})
    with bar:
        _, card = train_filter(model, Path(out_dir), seed=seed, cfg=cfg, report=report)
        card["target"] = target
        card["decoding"] = []
        if cfg.eval_per_task:
            block = {"block_length": cfg.width}
            for i, method in enumerate(METHODS):
                report("measure", i, len(METHODS), {})
                params = {**block, "head": out_dir} if method == "dlm.learn2pd" else block
                measured = measure_decoding(model, method, params, cfg.eval_per_task)
                measured["params"] = block  # without the folder: a path of this machine
                card["decoding"].append(measured)
            report("measure", len(METHODS), len(METHODS), {})
    write_card(Path(out_dir), card, command, threads)
    clear_checkpoint(Path(out_dir))
    out.print_json(json.dumps({k: v for k, v in card.items() if k != "decoding"}))
    err.print(f"saved {out_dir} (card: {Path(out_dir) / 'README.md'})")


@train_app.command("duo")
def train_duo_command(
    target: Annotated[str, typer.Option(help="The frozen causal LM: a folder or zoo:NAME.")] = "zoo:ar-long",
    out_dir: Annotated[Optional[str], typer.Option(
        "--out", help="Output folder; its checkpoint is resumed (default for a zoo model: the package's "
                      "zoo/MODEL/heads/duo, the gates sparse.duo finds with no flag).")] = None,
    seed: SeedOpt = 0,
    threads: TrainThreadsOpt = 1,
    steps: Annotated[Optional[int], typer.Option(help="Training steps (default: 200).")] = None,
    set_: Annotated[list[str], typer.Option(
        "--set", help="A setting of fastdecode/train/duo.py's DuoTraining (lr, reg, sinks, window, context_min, "
                      "context_max, ...), as NAME=VALUE.")] = [],  # noqa: B006
    eval_items: Annotated[int, typer.Option(help="longctx.passkey test items per context for the card.")] = 8,
    budgets: Annotated[str, typer.Option(help="sparse.duo budgets the card measures, comma-separated.")] = "320,128",
) -> None:
    """Optimise DuoAttention's gates (one per layer and key/value head) on a frozen model, as the authors do:
    distillation of the final hidden states on synthetic pass-key prompts + 0.05 * L1 of the gates. Rerun the same
    command to resume; the card compares sparse.duo with the gates, with the far-mass ranking, and dense decoding."""
    from pathlib import Path

    import torch

    import fastdecode
    from fastdecode.errors import ArgumentError
    from fastdecode.sparse.duo import DuoConfig
    from fastdecode.train.checkpoint import clear_checkpoint
    from fastdecode.train.duo import DuoTraining, train_gates
    from fastdecode.train.duo_card import configurations, measure, measure_errors, write_card

    _check_threads(threads)
    cfg = settings(DuoTraining, set_, "the gates' training (DuoTraining)", steps)
    try:
        budget_list = tuple(int(b) for b in budgets.split(",") if b.strip())
    except ValueError:
        raise ArgumentError(f"--budgets {budgets!r}: give token budgets as integers, e.g. 320,128.") from None
    out_dir = _heads_folder(out_dir, target, "duo", "gates")
    torch.set_num_threads(threads)
    model = fastdecode.load(target, device="cpu", dtype="float32")
    command = (f"fastdecode train duo --target {target} --seed {seed} --threads {threads}"
               + (f" --steps {steps}" if steps else "") + "".join(f" --set '{s}'" for s in set_)
               + f" --eval-items {eval_items} --budgets {budgets}")
    bar, report = training_bar(err, {"train": "training the gates",
                                     "measure": "longctx.passkey: dense, sparse.duo"}, every=10)
    with bar:
        _, card = train_gates(model, Path(out_dir), seed=seed, cfg=cfg, progress=one_phase(report))
        card["target"] = target
        card["retrieval"] = DuoConfig().retrieval
        card["decoding"] = []
        if eval_items:
            report("measure", 0, len(configurations(budget_list)), {})
            card["pattern_error"] = measure_errors(model, eval_items, out_dir)
            card["decoding"] = measure(model, eval_items, budget_list, gates=out_dir,
                                       report=lambda done, total: report("measure", done, total, {}))
    write_card(Path(out_dir), card, command, threads)
    clear_checkpoint(Path(out_dir))
    out.print_json(json.dumps({k: v for k, v in card.items() if k != "decoding"}))
    err.print(f"saved {out_dir} (card: {Path(out_dir) / 'README.md'})")


@train_app.command("dparallel")
def train_dparallel(
    out_dir: OutOpt = None,
    seed: SeedOpt = 0,
    threads: TrainThreadsOpt = 1,
    steps: Annotated[Optional[int], typer.Option(help="Training steps (default: 120).")] = None,
    set_: Annotated[list[str], typer.Option(
        "--set", help="A training setting as NAME=VALUE (items, lr, batch_tokens, entropy_weight, eval_per_task ...: "
                      "fastdecode/train/dparallel.py, DParallelTraining).")] = [],  # noqa: B006
) -> None:
    """Reproduce zoo:dlm-small-dparallel: dParallel's certainty-forcing distillation of zoo:dlm-small on its own
    correct answers, then its card (teacher and student with dlm.threshold and dlm.entropy_bound).

    The teacher first answers training items of the parallel-lists tasks (one token per step; cached, resumed
    where it stopped); the correct answers are kept; the student, initialised from the teacher, trains on them with
    the masked-diffusion cross-entropy plus the entropy of its correct predictions. Rerun the same command to resume
    an interrupted run; it is deterministic for a seed and thread count."""
    from pathlib import Path

    from fastdecode.config import parse_param_strings
    from fastdecode.train import dparallel
    from fastdecode.train.zoo import zoo_folder

    _check_threads(threads)
    cfg = dparallel.parse_settings(parse_param_strings(set_))
    if steps is not None:
        cfg = dataclasses.replace(cfg, steps=steps)
    folder = Path(out_dir) if out_dir else zoo_folder(dparallel.NAME)
    command = (f"fastdecode train dparallel --seed {seed} --threads {threads}" + (f" --steps {steps}" if steps else "")
               + "".join(f" --set '{s}'" for s in set_))
    bar, report = training_bar(err, {"data": f"{dparallel.TEACHER} answers training items",
                                     "train": "training the student",
                                     "measure": "measuring teacher and student on parallel-lists"}, every=25)
    with bar:
        card = dparallel.build(folder, seed, threads, cfg, command, report)
    summary = {k: {f: v for f, v in m.items() if f != "per_item"} for k, m in card.get("measured", {}).items()}
    out.print_json(json.dumps({**{k: v for k, v in card.items() if k != "measured"}, "measured": summary}))
    err.print(f"saved {folder} (card: {folder / 'README.md'})")


def _train_zoo(name: str, out_dir: str | None, seed: int, threads: int, steps: int | None, set_: list[str],
               eval_items: int) -> None:
    """Reproduce a zoo model from its recipe and a seed, then evaluate it and write its card."""
    from pathlib import Path

    from fastdecode.config import parse_param_strings
    from fastdecode.train.recipes import get_recipe, override
    from fastdecode.train.zoo import build, zoo_folder

    _check_threads(threads)
    if name == "ar-long" and set_ == ["recipe=recall"]:  # the from-scratch recall recipe (fastdecode/train/recall.py)
        _train_ar_long_recall(out_dir, seed, threads, steps, eval_items)
        return
    if name == "ar-long":  # stages of fine-tuning on zoo:ar-small (fastdecode/train/long.py), not a recipe
        _train_ar_long(Path(out_dir) if out_dir else zoo_folder(name), seed, threads, steps, set_, eval_items)
        return
    recipe = override(get_recipe(name), parse_param_strings(set_))
    folder = Path(out_dir) if out_dir else zoo_folder(name)
    command = (f"fastdecode train {name} --seed {seed} --threads {threads}" + (f" --steps {steps}" if steps else "")
               + "".join(f" --set '{s}'" for s in set_))
    bar, report = training_bar(err, {"train": f"training {name}"})
    with bar:
        metrics = build(recipe, folder, seed, threads, steps, eval_items, command, progress=one_phase(report),
                        status=lambda msg: bar.console.print(msg))
    out_metrics = {k: v for k, v in metrics.items() if k != "code_samples"}
    out.print_json(json.dumps(out_metrics))
    err.print(f"saved {folder} (card: {folder / 'README.md'})")


def _train_ar_long(folder, seed: int, threads: int, steps: int | None, set_: list[str], eval_items: int) -> None:
    from fastdecode.errors import ArgumentError
    from fastdecode.train import long

    if steps or set_:
        raise ArgumentError("ar-long is trained in stages (fastdecode/train/long.py, STAGES), which --steps and --set "
                            "do not reach: run one stage with `python -m fastdecode.train.long --help` for trials, "
                            "or the recall recipe with --set recipe=recall --out DIR.")
    total = sum(s.steps for s in long.STAGES)
    command = f"fastdecode train ar-long --seed {seed} --threads {threads}"
    with err.status("training ar-long") as spinner:
        done = [0]

        def on_step(row: dict) -> None:
            done[0] += 1
            spinner.update(f"training ar-long: stage {row['stage']}, step {done[0]}/{total}, loss {row['loss']:.3f}")

        metrics = long.build(folder, seed, threads, eval_items, command, status=err.print, on_step=on_step)
    out.print_json(json.dumps(metrics))
    err.print(f"saved {folder} (card: {folder / 'README.md'})")


def _train_ar_long_recall(out_dir: str | None, seed: int, threads: int, steps: int | None, eval_items: int) -> None:
    """The recall recipe's trial (fastdecode/train/recall.py, RECIPE): resumable, into --out only (it does not
    replace the shipped zoo:ar-long unless a person copies it there after comparing the cards)."""
    from pathlib import Path

    from fastdecode.errors import ArgumentError
    from fastdecode.train import recall

    if steps or not out_dir:
        raise ArgumentError("--set recipe=recall trains a trial into --out DIR (required) by RECIPE's step counts "
                            "(no --steps): `python -m fastdecode.train.recall --steps a,b,c --out DIR` scales them.")
    steps_of = {stage.name: stage.steps for stage in recall.RECIPE}
    bar, report = training_bar(err, {name: f"ar-long (recall): stage {name}" for name in steps_of})
    with bar:

        def on_step(row: dict) -> None:  # one bar per stage; a resumed run's bar starts where its checkpoint was
            if "loss" in row:
                report(row["stage"], row["step"] + 1, steps_of[row["stage"]], {"loss": row["loss"]})

        summary = recall.run(Path(out_dir), seed, threads, recall.Shape(), recall.RECIPE, ["1k", "2k", "4k"],
                             eval_items, on_step=on_step, status=lambda msg: bar.console.print(msg))
    out.print_json(json.dumps({k: summary[k] for k in ("train_minutes", "mqar_accuracy", "exact_match_fp32")}))
    err.print(f"saved {out_dir}")


@train_app.command("img-eval")
def train_img_eval(
    out_dir: Annotated[Optional[str], typer.Option(
        "--out", help="Output folder; its checkpoint is resumed (default: the package's zoo/img-eval).")] = None,
    seed: SeedOpt = 0,
    threads: TrainThreadsOpt = 1,
    steps: Annotated[Optional[int], typer.Option(help="Training steps (default 1500).")] = None,
) -> None:
    """Train the image benchmark's evaluator (a ~62 k-parameter CNN) on the MNIST-5k train split; write its card.

    Resumable (rerun the same command) and deterministic for a seed and thread count; needs the image extra."""
    from pathlib import Path

    from fastdecode.image.evaluator import default_folder
    from fastdecode.train.img_eval import EvalTraining, train_evaluator

    _check_threads(threads)
    cfg = EvalTraining() if steps is None else EvalTraining(steps=steps)
    folder = Path(out_dir) if out_dir else default_folder()
    command = (f"fastdecode train img-eval --seed {seed} --threads {threads}" + (f" --steps {steps}" if steps else "")
               + (f" --out {out_dir}" if out_dir else ""))
    bar, report = training_bar(err, {"train": "training img-eval"}, every=100)
    with bar:
        card = train_evaluator(folder, seed=seed, cfg=cfg, threads=threads, report=one_phase(report),
                               command=command)
    out.print_json(json.dumps(card))
    err.print(f"saved {folder} (card: {folder / 'README.md'})")


@app.command()
def serve(
    model: ModelOpt,
    method: Annotated[str, typer.Option(help="Default method of requests that name none (body: fastdecode.method).")]
    = "ar.greedy",
    draft: DraftOpt = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    served_model_name: Annotated[
        Optional[str], typer.Option(help="The model id clients send (default: what --model says).")
    ] = None,
    max_queue: Annotated[int, typer.Option(help="Requests that may wait; more get 429.")] = 256,
    max_batch: Annotated[int, typer.Option(help="Most rows (prompts x n) generated in one batch.")] = 16,
    batch_window_ms: Annotated[float, typer.Option(help="How long the engine waits for requests to batch.")] = 5.0,
    timeout: Annotated[float, typer.Option(help="Per-request timeout in seconds (0: none); then 504.")] = 600.0,
    max_body_mb: Annotated[float, typer.Option(help="Largest request body in MB; a larger one gets 413.")] = 4.0,
    threads: ThreadsOpt = None,
    trust_remote_code: RemoteOpt = False,
    kind: KindOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
) -> None:
    """Serve the model over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /metrics)."""
    try:
        from fastdecode.serve import ServeConfig, create_app, make_server
        from fastdecode.serve.listen import listen
    except ImportError as e:
        from fastdecode.errors import ArgumentError

        raise ArgumentError(f"fastdecode serve needs the serve extra ({e.name} is missing): "
                            "pip install 'fastdecode[serve]'.") from None
    import fastdecode

    fastdecode.get_method(method)
    config = ServeConfig(served_name=served_model_name or model, method=method, max_queue=max_queue,
                         max_batch=max_batch, window_s=batch_window_ms / 1000, timeout_s=timeout or None,
                         max_body_mb=max_body_mb)
    config.check()  # settings that could answer nothing, and the port, are refused before the model loads
    if threads is not None and threads < 1:
        from fastdecode.errors import ArgumentError

        raise ArgumentError(f"--threads must be at least 1, not {threads}.")
    sock = listen(host, port)
    _use_threads(model, threads, device)
    with err.status(f"loading {model}"):
        m = fastdecode.load(model, kind=kind, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
        d = (fastdecode.load(draft, device=m.device, dtype=m.dtype, trust_remote_code=trust_remote_code)
             if draft else None)
    server = make_server(create_app(m, d, config), host=host, port=port, log_level="info")
    err.print(f"serving {config.served_name} ({method} by default, {_threads_in_use()}) "
              f"on http://{host}:{port}/v1", highlight=False)
    server.run(sockets=[sock])


RAY_DEFAULT = "default"  # `bench --ray` without an address: Ray's own choice (RAY_ADDRESS, else a local instance)


def expand_list_options(argv: list[str]) -> list[str]:
    """Click takes one value per option: `bench --methods a b --seeds 1 2` -> `--methods a --methods b --seeds 1
    --seeds 2`; a bare `--ray` gets the value `default`."""
    if argv[1:2] not in (["bench"], ["bench-image"]):
        return argv
    out: list[str] = []
    current = None
    for i, arg in enumerate(argv):
        if arg == "--ray" and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            out += [arg, RAY_DEFAULT]
            current = None
            continue
        if arg.startswith("-"):
            current = arg if arg in ("--methods", "--seeds") else None
        elif current is not None and out[-1] != current:
            out.append(current)
        out.append(arg)
    return out


def _write_line(text: str) -> None:
    """Plain text on stdout as it is: one line of JSON, a report; never wrapped or read as markup."""
    out.file.write(text + "\n")
    out.file.flush()


def _say(label: str, style: str, message: str) -> None:
    """A labelled message on stderr, unwrapped (one line however long) and never read as rich markup."""
    from rich.text import Text

    err.print(Text.assemble((label, style), " ", message), soft_wrap=True, highlight=False)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """The library's own warnings (FastDecodeWarning) as one line each; others as Python shows them."""
    from fastdecode.errors import FastDecodeWarning

    if issubclass(category, FastDecodeWarning):
        _say("warning:", "yellow", str(message))
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


_python_showwarning = warnings.showwarning
_interrupt_told = False  # a command that printed its own message about an interrupt sets this


def main() -> None:
    """Entry point: run the app, turning library errors into one clear line and exit code 2.

    Usage errors (a missing or unknown option, a bad value, an unknown command) print the usage and exit 2, as
    typer does in standalone mode; Ctrl-C exits 130; anything unexpected prints one line and exits 1.
    """
    from fastdecode.errors import FastDecodeError

    # Ctrl-C: the handler `import fastdecode` installed exits 130 within an import (torch, transformers load
    # lazily, inside the commands) and raises KeyboardInterrupt elsewhere
    debug = os.environ.get("FASTDECODE_DEBUG") == "1"
    sys.argv = expand_list_options(sys.argv)
    warnings.showwarning = _show_warning
    try:
        # standalone mode: typer reports usage errors with the usage line (exit 2) whichever click it bundles,
        # and turns Ctrl-C into exit 130
        app(standalone_mode=True)
    except FastDecodeError as e:
        _refuse(str(e), debug)
    except OSError as e:  # the system refused a file operation: a full disk, a read-only folder, a permission
        if e.errno is None:  # raised by code, not by the system: unexpected
            _internal_error(e, debug)
        _refuse(_os_error_line(e), debug)
    except (typer.Abort, KeyboardInterrupt):
        _interrupted()
    except SystemExit as e:
        if e.code == 130:
            _interrupted()
        raise
    except Exception as e:  # anything unexpected: one line, never a bare traceback
        _internal_error(e, debug)


def _refuse(message: str, debug: bool) -> NoReturn:
    """One line and exit 2; FASTDECODE_DEBUG=1 shows the traceback first, with the same exit code."""
    if debug:
        traceback.print_exc()
    _say("error:", "bold red", message)
    sys.exit(2)


def _internal_error(e: Exception, debug: bool) -> NoReturn:
    if debug:
        raise e
    _say("internal error:", "bold red",
         f"{type(e).__name__}: {e}\n(set FASTDECODE_DEBUG=1 for the traceback and please report it)")
    sys.exit(1)


# what to do when the system refuses to write, by errno
_OS_ADVICE = {
    errno.ENOSPC: "free some space, or write to another folder",
    errno.EDQUOT: "free some space, or write to another folder",
    errno.EACCES: "write to a folder you may write to, or change its permissions",
    errno.EPERM: "write to a folder you may write to, or change its permissions",
    errno.EROFS: "the file system is read-only: write to another folder",
}


def _os_error_line(e: OSError) -> str:
    where = f"{e.filename}: " if e.filename else ""
    advice = _OS_ADVICE.get(e.errno or 0)
    return f"{where}{e.strerror or e}" + (f" ({advice})." if advice else ".")


def _interrupted() -> None:
    if not _interrupt_told:
        err.print("interrupted")
    sys.exit(130)


if __name__ == "__main__":
    main()
