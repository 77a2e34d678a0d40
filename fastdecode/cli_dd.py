"""`fastdecode train dd1` and `fastdecode train dd2`: the Distilled Decoding networks of an image teacher.

Added to the CLI's `train` group by `cli.py` (`add_dd_commands`); kept apart so the image family's commands do not
grow cli.py. Each run is resumable (rerun the same command), seeded, and writes the network in bfloat16 with its
card (README.md + card.json) into --out (default: beside a zoo teacher, zoo/MODEL/heads/dd1 or dd2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from .cli_train import settings, training_bar

TeacherOpt = Annotated[str, typer.Option(help="The image teacher: a folder or zoo:NAME.")]
OutOpt = Annotated[Optional[str], typer.Option(
    "--out", help="Output folder; its checkpoint is resumed (default for a zoo teacher: zoo/MODEL/heads/NAME).")]
SetOpt = Annotated[list[str], typer.Option("--set", help="A training setting as NAME=VALUE (DD1Training / "
                                                         "DD2Training in fastdecode/train/dd1.py, dd2.py).")]


def _out(teacher: str, out_dir: str | None, name: str) -> Path:
    from fastdecode.errors import ArgumentError

    if out_dir:
        return Path(out_dir)
    if not teacher.startswith("zoo:"):
        raise ArgumentError(f"--out is needed for a teacher outside the zoo ({teacher!r}): name the network's folder.")
    from fastdecode.train.zoo import zoo_folder

    return zoo_folder(teacher[4:]) / "heads" / name


def _teacher(teacher: str, threads: int) -> Any:
    import torch

    import fastdecode

    torch.set_num_threads(threads)
    model: Any = fastdecode.load(teacher, dtype="float32", device="cpu")
    if getattr(model, "image", None) is None:
        from fastdecode.errors import ArgumentError

        raise ArgumentError(f"{teacher!r} is not an image model: Distilled Decoding distils an image teacher "
                            "(e.g. zoo:img-ar).")
    return model.with_scale(model.image.cfg_scale)


def _progress(err: Console, what: str) -> Any:
    return training_bar(err, {"data": "teacher (noise, codes) pairs", "train": f"training {what}"}, every=25)


def add_dd_commands(train_app: typer.Typer, err: Console, out: Console) -> None:
    """Register `train dd1` and `train dd2` on the CLI's train group."""

    @train_app.command("dd1")
    def train_dd1_command(teacher: TeacherOpt = "zoo:img-ar", out_dir: OutOpt = None, seed: int = 0,
                          threads: int = 1, steps: Optional[int] = None,
                          set_: SetOpt = [],  # noqa: B006
                          init: Annotated[Optional[str], typer.Option(
                              help="Start from this DD network folder instead of the teacher's copy.")] = None
                          ) -> None:
        """Distilled Decoding 1: the teacher's noise -> codes pairs, then a 1/2-step network trained on them."""
        from fastdecode.train.dd1 import DD1Training, train_dd1
        from fastdecode.train.dd_card import write_dd_card

        cfg = settings(DD1Training, set_, "DD1's training (DD1Training)", steps)
        folder = _out(teacher, out_dir, "dd1")
        model = _teacher(teacher, threads)
        command = (f"fastdecode train dd1 --teacher {teacher} --seed {seed} --threads {threads}"
                   + (f" --out {out_dir}" if out_dir else "") + (f" --init {init}" if init else "")
                   + (f" --steps {steps}" if steps else "") + "".join(f" --set '{s}'" for s in set_))
        bar, report = _progress(err, "the DD1 network")
        with bar:
            card = train_dd1(model, folder, seed=seed, cfg=cfg, report=report, init=init)
        write_dd_card(folder, {**card, "teacher": teacher}, command, threads)
        out.print_json(json.dumps(card))
        err.print(f"saved {folder} (card: {folder / 'README.md'})")

    @train_app.command("dd2")
    def train_dd2_command(teacher: TeacherOpt = "zoo:img-ar", out_dir: OutOpt = None,
                          init: Annotated[str, typer.Option(
                              help="The generator's start: a DD1 network folder or zoo:MODEL/dd1, or 'teacher'.")]
                          = "zoo:img-ar/dd1", seed: int = 0, threads: int = 1, steps: Optional[int] = None,
                          set_: SetOpt = []) -> None:  # noqa: B006
        """Distilled Decoding 2: a one-step generator trained by conditional score distillation against the teacher."""
        from fastdecode.train.dd2 import DD2Training, train_dd2
        from fastdecode.train.dd_card import write_dd_card

        cfg = settings(DD2Training, set_, "DD2's training (DD2Training)", steps)
        folder = _out(teacher, out_dir, "dd2")
        model = _teacher(teacher, threads)
        command = (f"fastdecode train dd2 --teacher {teacher} --init {init} --seed {seed} --threads {threads}"
                   + (f" --out {out_dir}" if out_dir else "")
                   + (f" --steps {steps}" if steps else "") + "".join(f" --set '{s}'" for s in set_))
        bar, report = _progress(err, "the DD2 generator")
        with bar:
            card = train_dd2(model, folder, init=None if init == "teacher" else init, seed=seed, cfg=cfg,
                             report=report)
        write_dd_card(folder, {**card, "teacher": teacher}, command, threads)
        out.print_json(json.dumps(card))
        err.print(f"saved {folder} (card: {folder / 'README.md'})")
