"""`fastdecode serve` refuses settings it could not serve with in one line and exit 2, before the model loads
(run in-process through the CLI's entry point, as tests/test_cli.py does for Ctrl-C: no import per case)."""

from __future__ import annotations

import socket
import sys
import warnings

import pytest

from fastdecode import cli


def _one_clear_line(monkeypatch, capsys, args: list[str], needle: str) -> None:
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # main() installs its own
    monkeypatch.setattr(sys, "argv", ["fastdecode", "serve", "--model", "zoo:ar-tiny", *args])
    monkeypatch.setenv("FASTDECODE_DEBUG", "0")
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    stderr = capsys.readouterr().err
    assert exit_.value.code == 2, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), stderr
    assert needle in " ".join(stderr.split()), stderr


@pytest.mark.parametrize(("args", "needle"), [
    (["--port", "99999"], "--port must be between 1 and 65535"),
    (["--threads", "0"], "--threads must be at least 1"),
    (["--max-queue", "-1"], "--max-queue must be at least 1"),
    (["--max-queue", "0"], "--max-queue must be at least 1"),  # a server that would answer every request with 429
    (["--max-batch", "0"], "--max-batch must be at least 1"),
    (["--max-body-mb", "0"], "--max-body-mb must be more than 0"),
    (["--timeout", "-1"], "--timeout must not be negative"),
])
def test_bad_settings_are_one_line_and_exit_2(monkeypatch, capsys, args, needle):
    _one_clear_line(monkeypatch, capsys, args, needle)


def test_a_port_in_use_is_one_line_and_exit_2(monkeypatch, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        _one_clear_line(monkeypatch, capsys, ["--port", str(port)], f"Cannot listen on 127.0.0.1:{port}")
