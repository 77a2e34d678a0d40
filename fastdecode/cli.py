"""The command line: thin subcommands over the library. Only the CLI prints."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Fast decoding for language models, measured one way.")
out = Console()
err = Console(stderr=True)

ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Model folder or zoo:NAME.")]
RemoteOpt = Annotated[bool, typer.Option("--trust-remote-code", help="Run modelling code shipped in the model folder (LLaDA, Dream).")]
DeviceOpt = Annotated[Optional[str], typer.Option(help="cpu, cuda, cuda:1 ... (default: cuda if present).")]
DtypeOpt = Annotated[Optional[str], typer.Option(help="float32, bfloat16 or float16 (default: bf16 on CUDA, fp32 on CPU).")]


@app.command()
def generate(
    model: ModelOpt,
    prompt: Annotated[list[str], typer.Option("--prompt", "-p", help="Prompt text; repeat for a batch.")],
    method: Annotated[str, typer.Option(help="Registered method, see `fastdecode methods`.")] = "ar.greedy",
    param: Annotated[list[str], typer.Option("--param", help="Method parameter name=value; repeatable.")] = [],  # noqa: B006
    max_new_tokens: Annotated[Optional[int], typer.Option(help="Shortcut for --param max_new_tokens=N.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print results as JSON lines.")] = False,
    trust_remote_code: RemoteOpt = False,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
) -> None:
    """Generate text with a method and print it with a one-line stats summary."""
    import fastdecode
    from fastdecode.config import parse_param_strings

    params: dict[str, object] = dict(parse_param_strings(param))
    if max_new_tokens is not None:
        params["max_new_tokens"] = max_new_tokens
    fastdecode.get_method(method)  # fail on a bad method name before loading the model
    with err.status(f"loading {model}"):
        m = fastdecode.load(model, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
    results = fastdecode.generate(m, list(prompt), method, **params)
    for r in results:
        if as_json:
            out.print_json(json.dumps({"text": r.text, "token_ids": r.token_ids, "method": r.method, "stats": r.stats.to_dict()}))
        else:
            out.print(r.text, markup=False, highlight=False)
            err.print(f"[dim]{r.method}: {r.stats.summary()}[/dim]")


@app.command()
def methods(kind: Annotated[Optional[str], typer.Option(help="causal or diffusion")] = None) -> None:
    """List registered methods with their description and parameters."""
    import fastdecode

    table = Table(title="fastdecode methods")
    for col in ("method", "model", "lossless", "description", "parameters (defaults)"):
        table.add_column(col, overflow="fold")
    for m in fastdecode.methods(kind):
        params = ", ".join(f"{n}={d}" for n, d in m.params())
        table.add_row(m.name, m.kind, "yes" if m.lossless else "", m.description, params)
    out.print(table)


@app.command()
def info(
    model: Annotated[str, typer.Argument(help="Model folder or zoo:NAME.")],
    trust_remote_code: RemoteOpt = False,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
) -> None:
    """Show a model's kind, size, vocabulary and special tokens."""
    import fastdecode

    m = fastdecode.load(model, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
    table = Table(show_header=False, title=model)
    for k, v in m.describe().items():
        table.add_row(k, f"{v:,}" if isinstance(v, int) else str(v))
    out.print(table)


@app.command()
def demo(items: Annotated[int, typer.Option(help="Test items per task.")] = 8) -> None:
    """Run every bundled zoo model with every fitting method on a few test items; print one table."""
    from fastdecode.bench.demo import DEMO_TASKS, demo_rows

    table = Table(title="fastdecode demo: zoo models on held-out test items (batched, this machine)")
    for col in ("model", "method", "task", "accuracy", "tok/forward", "tok/s"):
        table.add_column(col, justify="left" if col in ("model", "method", "task") else "right")
    with err.status("running the demo") as status:
        for row in demo_rows(items):
            status.update(f"{row.model} · {row.method} · {row.task}")
            table.add_row(row.model, row.method, row.task, f"{row.accuracy:.0%}", f"{row.tokens_per_forward:.2f}", f"{row.tokens_per_s:.0f}")
    out.print(table)
    err.print(f"[dim]{items} items per task from the default test seed; tasks: {', '.join(DEMO_TASKS)}[/dim]")


@app.command()
def train(
    name: Annotated[str, typer.Argument(help="Zoo model: ar-small, ar-tiny or dlm-small.")],
    out_dir: Annotated[Optional[str], typer.Option("--out", help="Output folder (default: the package's zoo/NAME).")] = None,
    seed: Annotated[int, typer.Option(help="Training seed.")] = 0,
    threads: Annotated[int, typer.Option(help="torch CPU threads (results depend on it).")] = 2,
    steps: Annotated[Optional[int], typer.Option(help="Override the recipe's step count (for trials).")] = None,
    eval_items: Annotated[int, typer.Option(help="Test items per task for the model card.")] = 50,
) -> None:
    """Reproduce a zoo model from its recipe and a seed, then evaluate it and write its card."""
    from pathlib import Path

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from fastdecode.train.recipes import get_recipe
    from fastdecode.train.zoo import build, zoo_folder

    recipe = get_recipe(name)
    folder = Path(out_dir) if out_dir else zoo_folder(name)
    command = f"fastdecode train {name} --seed {seed} --threads {threads}" + (f" --steps {steps}" if steps else "")
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TextColumn("loss {task.fields[loss]:.3f}"), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err) as bar:
        task = bar.add_task(f"training {name}", total=steps or recipe.steps, loss=float("nan"))
        metrics = build(recipe, folder, seed, threads, steps, eval_items, command,
                        progress=lambda s, total, loss: bar.update(task, completed=s, loss=loss),
                        status=lambda msg: bar.console.print(msg))
    out_metrics = {k: v for k, v in metrics.items() if k != "code_samples"}
    out.print_json(json.dumps(out_metrics))
    err.print(f"saved {folder} (card: {folder / 'README.md'})")


def main() -> None:
    """Entry point: run the app, turning library errors into one clear line and exit code 2."""
    from fastdecode.errors import FastDecodeError

    debug = os.environ.get("FASTDECODE_DEBUG") == "1"
    try:
        app(standalone_mode=False)
    except FastDecodeError as e:
        if debug:
            raise
        err.print(f"[bold red]error:[/bold red] {e}", highlight=False)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        err.print("aborted")
        sys.exit(130)
    except Exception as e:  # click usage errors and anything unexpected: one line, never a bare traceback
        import click

        if isinstance(e, click.ClickException):
            e.show()
            sys.exit(e.exit_code)
        if debug:
            raise
        err.print(f"[bold red]internal error:[/bold red] {type(e).__name__}: {e}\n(set FASTDECODE_DEBUG=1 for the traceback and please report it)", highlight=False)
        sys.exit(1)


if __name__ == "__main__":
    main()
