"""The CLI end to end, as a user runs it (a subprocess), on a tiny model folder made by the tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FASTDECODE_DEBUG": "0"}
    return subprocess.run([sys.executable, "-m", "fastdecode", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_generate_prints_text_and_stats(causal_dir):
    p = run("generate", "--model", str(causal_dir), "--method", "ar.greedy", "--prompt", "the quick",
            "--param", "max_new_tokens=6")
    assert p.returncode == 0, p.stderr
    assert "ar.greedy:" in p.stderr and "forwards" in p.stderr and "tok/s" in p.stderr


def test_generate_json_matches_library(causal_dir, causal):
    import fastdecode

    p = run("generate", "-m", str(causal_dir), "-p", "the quick", "--max-new-tokens", "6", "--json")
    assert p.returncode == 0, p.stderr
    row = json.loads(p.stdout)
    assert row["token_ids"] == fastdecode.generate(causal, "the quick", max_new_tokens=6).token_ids
    assert row["stats"]["forwards"] == len(row["token_ids"])


def test_methods_lists_registry():
    p = run("methods")
    assert p.returncode == 0
    for name in ("ar.greedy", "ar.sample", "top_p"):
        assert name in p.stdout


def test_info_shows_kind_and_mask(diffusion_dir):
    p = run("info", str(diffusion_dir))
    assert p.returncode == 0, p.stderr
    assert "diffusion" in p.stdout and "mask_token_id" in p.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["generate", "-m", "/no/such/dir", "-p", "x"], "does not exist"),
        (["generate", "-m", "{causal}", "-p", "x", "--method", "ar.gredy"], "Did you mean 'ar.greedy'"),
        (["generate", "-m", "{causal}", "-p", "x", "--param", "tmperature=1"], "Unknown parameter"),
        (["generate", "-m", "{causal}", "-p", "   "], "empty"),
        (["generate", "-m", "{diffusion}", "-p", "x"], "needs a causal model"),
        (["generate", "-m", "{causal}", "-p", "x", "--method", "spec.draft_model"], "needs a draft model"),
    ],
)
def test_errors_are_one_line_without_traceback(args, message, causal_dir, diffusion_dir):
    args = [a.format(causal=causal_dir, diffusion=diffusion_dir) for a in args]
    p = run(*args)
    assert p.returncode == 2
    assert message in " ".join(p.stderr.split()) and "Traceback" not in p.stderr


def test_generate_with_a_draft_model(causal_dir):
    p = run("generate", "-m", str(causal_dir), "--draft", str(causal_dir), "--method", "spec.draft_model",
            "-p", "the quick", "--max-new-tokens", "8", "--json")
    assert p.returncode == 0, p.stderr
    stats = json.loads(p.stdout)["stats"]
    assert stats["draft_forwards"] > 0 and stats["accepted"] == stats["proposed"]  # a draft equal to the target


@pytest.mark.parametrize(
    "args, message",
    [
        (["generate", "-p", "x"], "Missing option '--model'"),
        (["generate", "-m", "{causal}", "-p", "x", "--no-such-option"], "No such option"),
        (["generate", "-m", "{causal}", "-p", "x", "--max-new-tokens", "abc"], "Invalid value for '--max-new-tokens'"),
        (["genrate", "-m", "{causal}"], "No such command 'genrate'"),
        ([], "Usage:"),
    ],
)
def test_usage_errors_print_usage_and_exit_2(args, message, causal_dir):
    p = run(*[a.format(causal=causal_dir) for a in args])
    assert p.returncode == 2, p.stderr
    shown = " ".join((p.stdout + p.stderr).split())
    assert "Usage:" in shown and message in shown
    assert "internal error" not in shown and "Traceback" not in shown


def test_ctrl_c_in_a_command_exits_130(monkeypatch, capsys):
    import fastdecode
    from fastdecode import cli

    def interrupted(kind=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(fastdecode, "methods", interrupted)
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # main() installs its own
    monkeypatch.setattr(sys, "argv", ["fastdecode", "methods"])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 130
    assert "interrupted" in capsys.readouterr().err


def test_ctrl_c_during_imports_exits_130_without_traceback():
    import signal
    import time

    env = {**os.environ, "FASTDECODE_DEBUG": "0"}

    def as_from_a_terminal() -> None:
        # a child inherits ignored signals and the blocked-signal mask: an earlier test's server threads or libraries
        # may leave SIGINT so in this process, and a Ctrl-C in a terminal reaches a process with neither
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    proc = subprocess.Popen([sys.executable, "-m", "fastdecode", "methods"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, preexec_fn=as_from_a_terminal)
    time.sleep(1.0)  # past interpreter start-up, while torch and transformers load
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted" in stderr


def _one_clear_line(p: subprocess.CompletedProcess, *needles: str) -> None:
    assert p.returncode == 2, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), p.stderr
    shown = " ".join(p.stderr.split())
    assert all(n in shown for n in needles), p.stderr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this torch has CUDA")
def test_device_cuda_without_cuda(causal_dir):
    p = run("generate", "-m", str(causal_dir), "-p", "x", "--device", "cuda")
    _one_clear_line(p, "CUDA", "--device cpu")


def test_device_that_is_not_a_device(causal_dir):
    p = run("info", str(causal_dir), "--device", "gpu0")
    _one_clear_line(p, "'gpu0'", "cuda:0")


def test_prompt_bytes_that_are_not_utf8(causal_dir):
    env = {**os.environ, "FASTDECODE_DEBUG": "0", "LC_ALL": "C.UTF-8"}
    p = subprocess.run([sys.executable, "-m", "fastdecode", "generate", "-m", str(causal_dir), "-p", b"caf\xe9"],
                       capture_output=True, text=True, env=env, timeout=120)
    _one_clear_line(p, "not UTF-8", "0xe9")


def test_bench_out_that_is_a_folder(causal_dir, tmp_path):
    p = run("bench", "--suite", "quick", "--model", str(causal_dir), "--methods", "ar.greedy", "--out", str(tmp_path),
            "--limit", "1")
    _one_clear_line(p, str(tmp_path), "is a folder", "results.jsonl")


def test_error_messages_are_not_read_as_markup(causal_dir):
    p = run("generate", "-m", str(causal_dir), "-p", "[bold]x[/bold]", "--method", "ar.gredy [red]")
    assert p.returncode == 2, p.stderr
    assert "'ar.gredy [red]'" in p.stderr


def test_kind_option_reaches_load(causal_dir):
    p = run("info", str(causal_dir), "--kind", "diffusion")
    _one_clear_line(p, "holds a causal model", "--kind")
    p = run("generate", "-m", str(causal_dir), "--kind", "causal", "-p", "the quick", "--max-new-tokens", "2")
    assert p.returncode == 0, p.stderr


def test_a_second_bench_on_one_file_exits_2_naming_the_other(causal_dir, tmp_path):
    pytest.importorskip("fcntl")
    out = tmp_path / "r.jsonl"
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(120)", str(out)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        p = run("bench", "--suite", "quick", "--model", str(causal_dir), "--methods", "ar.greedy", "--out", str(out),
                "--limit", "1", "--no-warmup")
    finally:
        holder.kill()
        holder.wait()
    assert p.returncode == 2, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error:") and f"{out} is being written by another process" in last
    if os.path.exists("/proc/locks"):  # Linux names the process holding the lock
        assert f"(pid {holder.pid})" in last


def test_report_skips_lines_that_are_not_rows_with_a_warning(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text('42\n{"model": "x"}\n')
    p = run("report", str(out))
    assert p.returncode == 0, p.stderr
    assert f"warning: {out} lines 1, 2: not a result row" in p.stderr and "Traceback" not in p.stderr


# -- start-up: --help and --version import neither torch nor transformers ---------------------------------------

@pytest.mark.parametrize("args", [["--version"], ["--help"]])
def test_help_and_version_start_without_torch(args):
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "fastdecode", *args], capture_output=True,
                       text=True, env={**os.environ, "FASTDECODE_DEBUG": "0"}, timeout=120)
    assert p.returncode == 0, p.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")}
    assert "fastdecode.cli" in imported and not imported & {"torch", "transformers"}
    if args == ["--version"]:
        import fastdecode

        assert p.stdout == f"fastdecode {fastdecode.__version__}\n"


def test_import_fastdecode_is_light_and_its_api_loads_on_use():
    code = ("import sys, fastdecode; assert 'torch' not in sys.modules; "
            "assert callable(fastdecode.load) and callable(fastdecode.generate) and 'torch' in sys.modules; "
            "assert fastdecode.Result.__name__ == 'Result' and fastdecode.methods('causal'); "
            "assert issubclass(fastdecode.UnknownMethodError, fastdecode.FastDecodeError); "
            "assert set(fastdecode.__all__) <= set(dir(fastdecode))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


# -- in-process cases: cli.main() as the console script runs it, without a subprocess's start-up ---------------

def one_error_line(text: str, *needles: str) -> None:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), text
    assert all(n in lines[0] for n in needles), text
    assert "internal error" not in text


def test_methods_with_an_unknown_kind(cli_main, capsys):
    assert cli_main("methods", "--kind", "bogus") == 2
    one_error_line(capsys.readouterr().err, "'bogus'", "'causal' or 'diffusion'")


def test_debug_shows_the_traceback_and_still_exits_2(cli_main, capsys):
    assert cli_main("generate", "-m", "/no/such", "-p", "x", "--method", "ar.gredy",
                           debug=True) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("error: Unknown method 'ar.gredy'")


def test_generate_json_is_one_line_per_result(cli_main, capsys, causal_dir):
    assert cli_main("generate", "-m", str(causal_dir), "-p", "the quick", "-p", "a b",
                           "--max-new-tokens", "3", "--json") == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(len(json.loads(line)["token_ids"]) <= 3 for line in lines)


@pytest.mark.parametrize(
    "config, needles",
    [
        ("[1]", ["holds a JSON list"]),
        ('{"model_type": "llama", "hidden_size": "abc"', ["not valid JSON"]),
        ('{"model_type": "llama", "hidden_size": "abc"}', ["config.json is invalid", "hidden_size"]),
        ('{"model_type": "llama", "hidden_size": 32}', ["do not have the shapes config.json", "in the weights but"]),
    ],
)
def test_a_corrupt_config_is_one_line_without_the_load_report(cli_main, capfd, causal_dir, tmp_path, config,
                                                               needles):
    import shutil

    shutil.copytree(causal_dir, tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text(config)
    assert cli_main("info", str(tmp_path / "m")) == 2
    captured = capfd.readouterr()
    one_error_line(captured.err, *needles)
    assert "LOAD REPORT" not in captured.out + captured.err and "above report" not in captured.err


@pytest.mark.parametrize("command", [
    ["bench", "--suite", "quick", "-m", "/no/such", "--methods", "ar.greedy", "--out", "{tmp}/r.jsonl"],
    ["train", "ar-tiny", "--out", "{tmp}/ar-tiny"],
    ["generate", "-m", "/no/such", "-p", "x"],
    ["serve", "-m", "/no/such"],
])
def test_threads_0_is_refused(cli_main, capsys, tmp_path, command):
    args = [a.format(tmp=tmp_path) for a in command]
    assert cli_main(*args, "--threads", "0") == 2
    one_error_line(capsys.readouterr().err, "--threads must be at least 1, not 0")


@pytest.mark.parametrize("command, what", [
    (["train", "drafter", "--kind", "medusa"], "head"),
    (["train", "filter"], "filter"),
    (["train", "duo"], "gates"),
])
def test_training_a_model_outside_the_zoo_needs_out(cli_main, capsys, command, what):
    """A trained part goes by default into the zoo model's heads/ folder; for a target outside the zoo the command
    asks for --out before it loads anything (the target here does not exist)."""
    assert cli_main(*command, "--target", "/no/such") == 2
    one_error_line(capsys.readouterr().err, "--out is needed for a target outside the zoo ('/no/such')",
                   f"name the {what}'s folder")


def test_an_unknown_suite_is_refused_before_the_model_loads(cli_main, capsys, tmp_path):
    assert cli_main("bench", "--suite", "quik", "--kind", "causal", "-m", "/no/such",
                           "--methods", "ar.greedy", "--out", str(tmp_path / "r.jsonl")) == 2
    one_error_line(capsys.readouterr().err, "Unknown suite 'quik'. Did you mean 'quick'?")


def test_bench_help_and_docs_list_every_suite():
    import re
    from pathlib import Path

    import typer

    from fastdecode import cli
    from fastdecode.bench.suites import SUITES

    bench = typer.main.get_command(cli.app).commands["bench"]  # type: ignore[attr-defined]
    help_text = next(p for p in bench.params if p.name == "suite").help
    docs = (Path(__file__).parents[1] / "docs" / "cli.md").read_text()
    for text in (help_text, docs):
        assert set(SUITES) <= set(re.findall(r"[\w-]+", text))


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory, causal):
    from fastdecode.bench.harness import run_bench
    from fastdecode.bench.suites import Suite

    out = tmp_path_factory.mktemp("rows") / "r.jsonl"
    run_bench(Suite("tiny", "one item", (("lists.sort", 1),)), causal, ["ar.greedy"], out,
              params={"ar.greedy": {"max_new_tokens": 4}}, warmup=False)
    return out


def test_report_out_writes_the_file_and_prints_only_where(cli_main, capsys, rows_file, tmp_path):
    md = tmp_path / "r.md"
    assert cli_main("report", str(rows_file), "--out", str(md)) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip() == f"wrote {md}"
    assert "ar.greedy" in md.read_text()


def test_report_refuses_a_row_with_a_score_that_is_not_a_number(cli_main, capsys, rows_file, tmp_path):
    row = json.loads(rows_file.read_text().splitlines()[0])
    (tmp_path / "r.jsonl").write_text(json.dumps({**row, "score": "abc"}) + "\n")
    assert cli_main("report", str(tmp_path / "r.jsonl")) == 2
    one_error_line(capsys.readouterr().err, 'has score "abc", not a number')


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_full_disk_is_one_line(cli_main, capsys, rows_file):
    assert cli_main("report", str(rows_file), "--out", "/dev/full") == 2
    one_error_line(capsys.readouterr().err, "No space left on device", "free some space")


def test_a_read_only_folder_is_one_line(cli_main, monkeypatch, capsys, rows_file, tmp_path):
    import errno
    from pathlib import Path

    read_only = tmp_path / "ro" / "r.md"

    def refused(self, *args, **kwargs):  # what a read-only folder answers (root writes anywhere, so say it here)
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "write_text", refused)
    assert cli_main("report", str(rows_file), "--out", str(read_only)) == 2
    one_error_line(capsys.readouterr().err, f"{read_only}: Permission denied", "write to a folder you may write to")


def test_tables_in_a_pipe_are_not_cut_to_80_columns(monkeypatch, capsys):
    from rich.table import Table

    from fastdecode import cli

    monkeypatch.delenv("COLUMNS", raising=False)
    name = "spec.draft_model:" + ",".join(f"option_{i}=value_{i}" for i in range(8))  # a long configuration label
    table = Table()
    for col in ("method", "accuracy", "TPF", "tok/s", "speed-up"):
        table.add_column(col)
    table.add_row(name, "90%", "1.50", "120", "1.10×")
    cli._console().print(table)
    assert name in capsys.readouterr().out


def test_bench_into_a_read_only_folder_is_one_line_after_the_model_loads(cli_main, monkeypatch, capsys, causal_dir,
                                                                         tmp_path):
    import errno
    from pathlib import Path

    out, open_ = tmp_path / "ro" / "r.jsonl", Path.open

    def read_only(self, *args, **kwargs):  # the results file cannot be created (root writes anywhere: say it here)
        if self == out:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return open_(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", read_only)
    assert cli_main("bench", "--suite", "quick", "-m", str(causal_dir), "--methods",
                           "ar.greedy", "--out", str(out), "--limit", "1", "--no-warmup") == 2
    captured = capsys.readouterr()
    one_error_line(captured.err, f"{out}: Permission denied")  # no progress bar drawn before it, no empty line
    assert captured.out == ""


def test_graphs_flag_reaches_load_and_its_refusal_says_how_to_fix_it(cli_main, capsys):
    """--graphs asks for CUDA graphs: on the CPU `load` refuses with the fix; --no-graphs is the CPU default."""
    assert cli_main("generate", "-m", "zoo:ar-tiny", "-p", "ab", "--param", "max_new_tokens=2", "--graphs") != 0
    err = capsys.readouterr().err
    assert "graphs=True captures CUDA graphs" in err and "CUDA device" in err
    assert cli_main("generate", "-m", "zoo:ar-tiny", "-p", "ab", "--param", "max_new_tokens=2", "--no-graphs") == 0
