"""The progress display every `fastdecode train ...` command shares (fastdecode.cli_train.py)."""

from __future__ import annotations

import io

from rich.console import Console

from fastdecode.cli_train import one_phase, training_bar


def _log_console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=False, width=200), buf


def test_a_redirected_log_gets_a_line_every_n_steps_with_the_mean_loss():
    err, buf = _log_console()
    bar, report = training_bar(err, {"train": "training the head"}, every=2)
    with bar:
        for step, loss in enumerate([4.0, 2.0, 1.0, 3.0, 5.0], start=1):
            report("train", step, 5, {"loss": loss, "acc0": 0.5})
    lines = [line for line in buf.getvalue().splitlines() if line.startswith("train ")]
    assert [line.split()[1] for line in lines] == ["2/5", "4/5", "5/5"]
    assert "loss 2 acc0 0.5 (mean loss since the last line 3)" in lines[0]
    assert "(mean loss since the last line 2)" in lines[1]
    assert "mean loss" not in lines[2]  # one step since the last line: its own loss is the mean


def test_shown_metrics_and_one_phase_trainers():
    err, buf = _log_console()
    bar, report = training_bar(err, every=1, shown=("loss",))
    progress = one_phase(report, "fit")
    with bar:
        progress(1, 2, 0.25)  # a trainer that reports a bare loss
        progress(2, 2, {"loss": 0.125, "hidden": 7.0})
    lines = [line for line in buf.getvalue().splitlines() if line.startswith("fit ")]
    assert lines[0].startswith("fit 1/2 loss 0.25 elapsed")
    assert lines[1].startswith("fit 2/2 loss 0.125 elapsed")  # a line every step: no mean to add
    assert "hidden" not in buf.getvalue()


def test_settings_coerce_each_value_to_its_field_and_refuse_unknown_names():
    from dataclasses import dataclass

    import pytest

    from fastdecode.cli_train import settings
    from fastdecode.errors import ArgumentError

    @dataclass(frozen=True)
    class Training:
        steps: int = 10
        lr: float = 1e-3
        shuffle: bool = True
        name: str = "x"

    got = settings(Training, ["lr=0.5", "shuffle=false", "name=y"], "the test's training", steps=3)
    assert got == Training(steps=3, lr=0.5, shuffle=False, name="y")  # "false" is False, not bool("false")
    with pytest.raises(ArgumentError, match="--set lrate: not a setting of the test's training; choose from lr, name"):
        settings(Training, ["lrate=1"], "the test's training")
