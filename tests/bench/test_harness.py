"""The bench harness end to end on tiny models: rows, resume, refusals and the report."""

from __future__ import annotations

import json

import pytest

from fastdecode.bench import harness
from fastdecode.bench.harness import Entry, read_rows, row_key, run_bench, split_params
from fastdecode.bench.report import build_report
from fastdecode.bench.suites import SUITES, BenchError, Suite, get_suite
from fastdecode.bench.tasks import DEFAULT_TEST_SEED, TASKS, format_prompt
from fastdecode.speculative.memory import forget
from fastdecode.stats import Stats

SUITE = Suite("tiny", "three items", (("lists.sort", 2), ("puzzles.sudoku", 1)))
SHORT = {
    "ar.greedy": {"max_new_tokens": 12}, "hf.greedy": {"max_new_tokens": 12},
    "ar.sample": {"max_new_tokens": 12, "seed": 0},
}


def bench(target, out, methods=("hf.greedy", "ar.sample"), **kwargs):
    params = {m: p for m, p in SHORT.items() if m in (*methods, "ar.greedy")}
    return run_bench(SUITE, target, list(methods), out, params=params, **kwargs)


@pytest.fixture(scope="module")
def results(target, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "results.jsonl"
    summary = bench(target, out)
    return summary, out


def test_rows_are_complete_and_consistent(results, target):
    summary, out = results
    rows = read_rows(out)
    assert summary.written == len(rows) == 3 * 3  # ar.greedy added as the baseline
    assert [line for line in out.read_text().splitlines() if line]  # plain JSON lines
    assert {r["method"] for r in rows} == {"ar.greedy", "hf.greedy", "ar.sample"}
    stat_fields = set(Stats().to_dict())
    for r in rows:
        assert stat_fields <= set(r)
        assert r["tokens_per_forward"] == pytest.approx(r["new_tokens"] / r["forwards"])
        assert r["accepted"] <= r["proposed"] or r["proposed"] == 0
        assert r["new_tokens"] == len(r["token_ids"]) <= 12
        assert 0.0 <= r["score"] <= 1.0
        assert r["suite"] == "tiny" and r["seed"] == DEFAULT_TEST_SEED and r["model"] == target.name
        assert r["params"]["max_new_tokens"] == 12 and r["is_baseline"] == (r["method"] == "ar.greedy")
        assert r["fastdecode_version"] and r["torch_version"] and r["machine"]["cores"] >= 1
    by = {(r["method"], r["task"], r["item"]): r for r in rows}
    for (method, task, item), r in by.items():
        base = by[("ar.greedy", task, item)]
        assert r["equal_to_baseline"] == (r["token_ids"] == base["token_ids"])
        if method == "hf.greedy":
            assert r["equal_to_baseline"] is True
    assert by[("ar.sample", "lists.sort", 0)]["params"]["seed"] == 0


def test_report_renders_markdown_and_plots(results, tmp_path):
    _, out = results
    report = build_report([out], out=tmp_path / "RESULTS.md", plots_dir=tmp_path / "plots",
                          command="fastdecode report x")
    text = (tmp_path / "RESULTS.md").read_text()
    assert text.startswith("# fastdecode benchmark report") and "`fastdecode report x`" in text
    assert str(out) in text and "Leaderboard" in text and "≥ 95%" in text
    for method in ("ar.greedy", "hf.greedy", "ar.sample"):
        assert f"| {method}" in text or f"**{method}**" in text
    assert len(report.plots) == 2 and all(p.stat().st_size > 1000 for p in report.plots)
    assert all(f"]({p.relative_to(tmp_path)})" in text for p in report.plots)
    base = next(s for s in report.summaries if s.is_baseline)
    assert base.speedup == pytest.approx(1.0) and base.equal_rate == 1.0 and base.tpf == pytest.approx(1.0)


def test_report_splits_speculative_time(tmp_path):
    from fastdecode.bench.report import render, summarize, time_table

    def row(method, wall, draft=0.0, verify=0.0):
        return {"suite": "s", "model": "m", "method": method, "task": "t", "score": 1.0, "new_tokens": 10,
                "forwards": 5, "wall_s": wall, "draft_s": draft, "verify_s": verify,
                "is_baseline": method == "ar.greedy"}

    rows = [row("ar.greedy", 2.0), row("spec.pld", 1.0, 0.1, 0.7), row("spec.pld", 1.0, 0.1, 0.7)]
    summaries = summarize(rows)
    pld = next(s for s in summaries if s.method == "spec.pld")
    assert pld.draft_share == pytest.approx(0.1) and pld.verify_share == pytest.approx(0.7)
    assert next(s for s in summaries if s.is_baseline).draft_share is None
    assert time_table(summaries) == ["| method | drafting | verification | other (roll-back, bookkeeping) |",
                                     "|---|---:|---:|---:|", "| spec.pld | 10.0% | 70.0% | 20.0% |"]
    assert "Where the time goes" in render(rows, summaries, [], None, {}, None)


def test_resume_after_interrupt_gives_the_same_rows(target, tmp_path):
    out = tmp_path / "r.jsonl"

    def stop_after_four(progress):
        if progress.phase == "row" and progress.done == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        bench(target, out, on_progress=stop_after_four)
    assert len(read_rows(out)) == 4
    with out.open("a") as f:  # a hard kill in the middle of writing a row
        f.write('{"suite": "tiny", "task": "lists.so')
    assert len(read_rows(out)) == 4
    summary = bench(target, out)
    assert (summary.skipped, summary.written) == (4, 5)
    rows = read_rows(out)
    keys = [row_key(r) for r in rows]
    assert len(keys) == len(set(keys)) == 9
    assert all(json.loads(line) for line in out.read_text().splitlines())  # the partial line is gone
    again = bench(target, out)
    assert (again.skipped, again.written) == (9, 0)
    assert {r["equal_to_baseline"] for r in rows if r["method"] == "hf.greedy"} == {True}


def test_a_damaged_middle_line_is_refused(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text('{"a": 1}\nnot json\n{"b": 2}\n')
    with pytest.raises(BenchError, match="line 2"):
        read_rows(out)


def test_training_seeds_are_refused(target, tmp_path):
    with pytest.raises(BenchError, match="not a test seed"):
        bench(target, tmp_path / "r.jsonl", seeds=[5])
    assert not (tmp_path / "r.jsonl").exists()


def test_other_test_seeds_draw_other_items(target, tmp_path):
    out = tmp_path / "r.jsonl"
    bench(target, out, methods=["hf.greedy"], seeds=[DEFAULT_TEST_SEED + 7], limit=1)
    rows = read_rows(out)
    assert {r["seed"] for r in rows} == {DEFAULT_TEST_SEED + 7} and len(rows) == 2 * 2


def test_unknown_suite_names_the_close_one():
    with pytest.raises(BenchError, match="Did you mean 'puzzles'"):
        get_suite("puzzle")


def test_suites_cover_their_tasks():
    assert {t for t, _ in SUITES["parallel-lists"].tasks} == {
        n for n, t in TASKS.items() if t.family in ("lists", "letters")
    }
    assert {t for t, _ in SUITES["puzzles"].tasks} == {"puzzles.sudoku", "puzzles.latin_square"}
    assert [t for t, _ in SUITES["code"].tasks] == ["code.complete"]
    assert sum(n for _, n in SUITES["quick"].tasks) <= 20
    assert [(t.name, n) for t, _, n in SUITES["puzzles"].plan(limit=3)] == [
        ("puzzles.sudoku", 3), ("puzzles.latin_square", 3)
    ]


def test_bad_requests_fail_before_running(target, tmp_path):
    with pytest.raises(BenchError, match="not in --methods"):
        run_bench(SUITE, target, ["hf.greedy"], tmp_path / "r.jsonl", params={"ar.sample": {"seed": 1}})
    with pytest.raises(Exception, match="needs a diffusion model"):
        run_bench(SUITE, target, ["dlm.baseline"], tmp_path / "r.jsonl")
    with pytest.raises(Exception, match="--draft"):
        run_bench(SUITE, target, ["hf.assisted"], tmp_path / "r.jsonl")
    assert not read_rows(tmp_path / "r.jsonl")


def test_split_params():
    assert split_params(["ar.sample.seed=1", "hf.prompt_lookup.num_tokens=5"]) == {
        "ar.sample": {"seed": "1"}, "hf.prompt_lookup": {"num_tokens": "5"}}
    with pytest.raises(BenchError, match="method.name=value"):
        split_params(["seed=1"])


def test_harness_is_quiet(target, tmp_path, capsys):
    bench(target, tmp_path / "r.jsonl", methods=["hf.greedy"], limit=1)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
    assert harness.SCHEMA == 1



def test_warm_up_does_not_hand_spec_suffix_the_first_answer(target, tmp_path):
    """The pre-flight and warm-up runs keep their outputs in memories of their own, so the first measured row does
    not draft its own answer; later rows draft from their configuration's earlier rows (SuffixDecoding's
    cross-request memory); the model's own memory is left alone."""
    import fastdecode
    from fastdecode.speculative.memory import DrafterMemory, memory_of

    forget(target)
    out = tmp_path / "suffix.jsonl"
    params = {"ar.greedy": {"max_new_tokens": 12}, "spec.suffix": {"max_new_tokens": 12}}
    run_bench(SUITE, target, ["spec.suffix"], out, params=params, limit=1)
    rows = [r for r in read_rows(out) if r["method"] == "spec.suffix"]
    assert rows[0]["task"] == "lists.sort" and all(r["equal_to_baseline"] is True for r in rows)
    assert len(memory_of(target)) == 0
    memory = DrafterMemory()  # the measured requests, in order, with one memory that starts empty
    for r in rows:
        item = TASKS[r["task"]].items(r["seed"], r["item"] + 1)[r["item"]]
        s = fastdecode.generate(target, format_prompt(item.prompt), "spec.suffix", max_new_tokens=12, memory=memory)
        assert (r["forwards"], r["accepted"]) == (s.stats.forwards, s.stats.accepted)
    assert len(memory) == 1  # the rows fed one global tree
    assert len(memory_of(target)) == 0


def test_rows_run_item_by_item_and_each_configuration_keeps_its_own_memory(target, tmp_path):
    """Configurations are interleaved item by item (the baseline first), and a drafter that remembers earlier
    requests sees only its own configuration's: each row equals the row of a run of that configuration alone."""
    params = {"ar.greedy": {"max_new_tokens": 12}, "spec.suffix": {"max_new_tokens": 12}}
    both = tmp_path / "both.jsonl"
    run_bench(SUITE, target, ["spec.suffix", "spec.suffix:tree=true"], both, params=params)
    rows = read_rows(both)
    items = [(r["task"], r["item"]) for r in rows]
    assert items == [i for i in dict.fromkeys(items) for _ in range(3)]  # three rows per item, then the next item
    assert [r["method"] for r in rows[::3]] == ["ar.greedy"] * 3
    for config in ("spec.suffix", "spec.suffix:tree=true"):
        alone = tmp_path / f"{config}.jsonl"
        run_bench(SUITE, target, [config], alone, params=params)
        tree = config.endswith("true")
        mine = [r for r in rows if r["method"] == "spec.suffix" and r["params"]["tree"] == tree]
        ref = [r for r in read_rows(alone) if r["method"] == "spec.suffix"]
        assert [(r["forwards"], r["accepted"], r["token_ids"]) for r in mine] == [
            (r["forwards"], r["accepted"], r["token_ids"]) for r in ref]
    forget(target)


def test_speed_ups_use_the_baseline_of_the_same_file():
    from fastdecode.bench.report import summarize

    def row(method, source, wall):
        return {"suite": "s", "model": "m", "method": method, "task": "t", "score": 1.0, "new_tokens": 10,
                "forwards": 10, "wall_s": wall, "is_baseline": method == "ar.greedy", "_source": source}

    # two runs on the same suite and model, the second on a slower (busier) machine: 2x faster within each file
    rows = [row("ar.greedy", "a", 1.0), row("spec.pld", "a", 0.5),
            row("ar.greedy", "b", 3.0), row("spec.ngram", "b", 1.5)]
    by = {s.method: s for s in summarize(rows)}
    assert by["spec.pld"].speedup == pytest.approx(2.0) and by["spec.ngram"].speedup == pytest.approx(2.0)
    assert by["ar.greedy"].speedup == pytest.approx(1.0) and by["ar.greedy"].items == 2


def test_the_leaderboard_ranks_a_method_against_the_baseline_of_its_own_file():
    from fastdecode.bench.report import leaderboard, summarize

    def row(method, source, score, forwards):
        budget = 384 if source == "long" else TASKS["lists.copy"].max_new_tokens
        return {"suite": "s", "model": "m", "method": method, "task": "lists.copy", "score": score, "new_tokens": 12,
                "forwards": forwards, "wall_s": 1.0, "is_baseline": method == "dlm.baseline", "_source": source,
                "params": {"max_new_tokens": budget}}

    # the long canvas's baseline scores 0.25, the short one's 1.0; a long-canvas method at 0.25 and TPF 6 keeps
    # all of its own baseline's accuracy but only a quarter of the short baseline's
    rows = [row("dlm.baseline", "short", 1.0, 12), row("dlm.threshold", "short", 1.0, 4),
            row("dlm.baseline", "long", 0.25, 12), row("dlm.prophet", "long", 0.25, 2)]
    summaries = summarize(rows)
    assert {s.method: s.tpf_by_task for s in summaries}["dlm.prophet"] == {"lists.copy": 6.0}
    board = {base.sources: (base.accuracy, best) for _, _, base, best in leaderboard(summaries)}
    assert set(board) == {("short",), ("long",)}
    accuracy, best = board[("short",)]
    assert accuracy == 1.0 and {b.method for b in best.values()} == {"dlm.threshold"}
    accuracy, best = board[("long",)]
    assert accuracy == 0.25 and {b.method for b in best.values()} == {"dlm.prophet"}


def test_an_overridden_budget_is_its_own_configuration():
    from fastdecode.bench.report import summarize

    budget = TASKS["lists.copy"].max_new_tokens

    def row(method, max_new_tokens, wall):
        return {"suite": "s", "model": "m", "method": method, "task": "lists.copy", "score": 1.0, "new_tokens": 10,
                "forwards": 10, "wall_s": wall, "is_baseline": method == "dlm.baseline",
                "params": {"max_new_tokens": max_new_tokens, "cache": "none"}, "_source": str(max_new_tokens)}

    # the task's own budget is not part of a name; a run at 256 tokens is another configuration, not pooled with it
    rows = [row("dlm.baseline", budget, 1.0), row("dlm.threshold", budget, 0.5),
            row("dlm.baseline", 256, 4.0), row("dlm.threshold", 256, 1.0)]
    by = {s.label: s for s in summarize(rows)}
    assert set(by) == {"dlm.baseline (max_new_tokens=per-task)", "dlm.baseline (max_new_tokens=256)",
                       "dlm.threshold (max_new_tokens=per-task)", "dlm.threshold (max_new_tokens=256)"}
    assert by["dlm.threshold (max_new_tokens=256)"].speedup == pytest.approx(4.0)
    assert by["dlm.threshold (max_new_tokens=per-task)"].speedup == pytest.approx(2.0)
    assert all(s.items == 1 for s in by.values())


def test_a_diffusion_model_decodes_on_the_canvas_fitted_to_its_tokenizer(diffusion, tmp_path):
    from fastdecode.bench.report import summarize

    out = tmp_path / "r.jsonl"
    suite = Suite("sudoku", "one item", (("puzzles.sudoku", 1),))  # a short budget: the tiny model has 128 positions
    run_bench(suite, diffusion, ["dlm.threshold:max_new_tokens=16"], out, params={"dlm.baseline": {"block_length": 4}})
    rows = read_rows(out)
    for row in rows:
        canvas = TASKS[row["task"]].canvas_length(diffusion.tokenizer)
        if row["method"] == "dlm.baseline":  # the default: the canvas, not the worst-case budget
            assert row["default_budget"] and row["params"]["max_new_tokens"] == canvas
        else:  # given by the entry
            assert not row["default_budget"] and row["params"]["max_new_tokens"] == 16
    assert {s.label for s in summarize(rows)} == {"dlm.baseline", "dlm.threshold"}


def test_a_canvas_holds_the_longest_training_answer_and_never_exceeds_the_budget(tokenizer):
    for task in TASKS.values():
        canvas = task.canvas_length(tokenizer)
        assert canvas <= task.max_new_tokens and canvas % 16 == 0 or canvas == task.max_new_tokens
        if task.family != "code":
            longest = max(len(tokenizer(i.reference, add_special_tokens=False)["input_ids"]) + 1
                          for i in task.items(0, 200))
            assert canvas >= min(task.max_new_tokens, longest)
    assert TASKS["code.complete"].canvas_length(tokenizer) == TASKS["code.complete"].max_new_tokens


def test_tokenizers_with_one_name_and_size_get_their_own_canvases():
    import random as stdlib_random
    from pathlib import Path

    from fastdecode.train.tokenizer import train_tokenizer

    task = TASKS["lists.copy"]
    answers = [i.reference for name in ("lists.copy", "lists.sort", "letters.copy") for i in TASKS[name].items(0, 500)]
    source = Path(stdlib_random.__file__).read_text(encoding="utf-8")[:40000]
    merged, split = train_tokenizer(answers, vocab_size=500), train_tokenizer([source], vocab_size=500)
    # nothing tells them apart but the vocab
    assert (merged.name_or_path, len(merged)) == (split.name_or_path, len(split))
    assert task.canvas_length(merged) < task.max_new_tokens  # names are whole tokens: a fitted canvas
    longest = max(len(split(i.reference, add_special_tokens=False)["input_ids"]) + 1 for i in task.items(0, 200))
    assert task.canvas_length(split) >= min(task.max_new_tokens, longest)  # names in pieces: not merged's canvas


def test_the_zoo_tokenizer_gets_canvases_shorter_than_the_worst_case_budget():
    from transformers import AutoTokenizer

    from fastdecode.models.loading import resolve

    zoo = AutoTokenizer.from_pretrained(resolve("zoo:dlm-small"))
    for name in ("lists.copy", "lists.insert_index", "letters.repeat"):
        task = TASKS[name]
        longest = max(len(zoo(i.reference, add_special_tokens=False)["input_ids"]) + 1 for i in task.items(0, 1000))
        assert longest < task.canvas_length(zoo) < task.max_new_tokens  # room for every training answer, no more


def test_a_configuration_of_the_baseline_method_runs_beside_the_baseline(diffusion, tmp_path):
    from fastdecode.bench.report import summarize

    out = tmp_path / "r.jsonl"
    params = {"dlm.baseline": {"max_new_tokens": 8, "block_length": 4}}  # applies to both entries of the method
    summary = run_bench(SUITE, diffusion, ["dlm.baseline:cache=dual"], out, params=params)
    rows = read_rows(out)
    assert summary.written == len(rows) == 2 * 3
    plain = [r for r in rows if r["is_baseline"]]
    dual = [r for r in rows if not r["is_baseline"]]
    assert {r["params"]["cache"] for r in plain} == {"none"} and {r["params"]["cache"] for r in dual} == {"dual"}
    assert {r["params"]["block_length"] for r in rows} == {4} and {r["method"] for r in rows} == {"dlm.baseline"}
    by = {(r["task"], r["item"]): r["token_ids"] for r in plain}
    assert all(r["equal_to_baseline"] == (r["token_ids"] == by[(r["task"], r["item"])]) for r in dual)
    labels = {s.label: s for s in summarize(rows)}
    assert set(labels) == {"dlm.baseline (cache=none)", "dlm.baseline (cache=dual)"}
    assert labels["dlm.baseline (cache=none)"].is_baseline and not labels["dlm.baseline (cache=dual)"].is_baseline
    assert run_bench(SUITE, diffusion, ["dlm.baseline:cache=dual"], out, params=params).written == 0  # resumes


def test_a_methods_entry_is_parsed_into_method_and_its_own_values():
    assert Entry.parse("dlm.threshold") == Entry("dlm.threshold", "dlm.threshold", {})
    entry = Entry.parse("dlm.baseline:cache=dual, block_length=16")
    assert (entry.method, dict(entry.own)) == ("dlm.baseline", {"cache": "dual", "block_length": "16"})
    with pytest.raises(BenchError, match="method:name=value"):
        Entry.parse("dlm.baseline:dual")


def test_speed_ups_use_the_baseline_of_the_same_run_within_a_file():
    from fastdecode.bench.report import method_table, summarize

    def row(method, run, wall):
        return {"suite": "s", "model": "m", "method": method, "task": "t", "score": 1.0, "new_tokens": 10,
                "forwards": 10, "wall_s": wall, "is_baseline": method == "ar.greedy", "_source": "f", "run": run}

    # one file, two runs on a machine whose speed moved between them: 2x within each run; pooling the two
    # baselines would give spec.ngram 1.5x; a third run added spec.jacobi without measuring the baseline
    rows = [row("ar.greedy", "r1", 1.0), row("spec.pld", "r1", 0.5), row("ar.greedy", "r2", 2.0),
            row("spec.ngram", "r2", 1.0), row("spec.jacobi", "r3", 1.5)]
    summaries = summarize(rows)
    by = {s.method: s for s in summaries}
    assert by["spec.pld"].speedup == pytest.approx(2.0) and by["spec.ngram"].speedup == pytest.approx(2.0)
    assert not by["spec.ngram"].baseline_other_run and by["ar.greedy"].speedup == pytest.approx(1.0)
    # against both runs' baselines pooled (20 tokens in 3 s), as it ran 10 tokens in 1.5 s
    assert by["spec.jacobi"].baseline_other_run and by["spec.jacobi"].speedup == pytest.approx(1.0)
    table = "\n".join(method_table(summaries))
    assert "1.00× †" in table and table.count("†") == 2  # the flagged cell and its footnote


def test_bench_rows_name_their_run(target, tmp_path):
    out = tmp_path / "r.jsonl"
    short = {"max_new_tokens": 8}
    for method in ("spec.pld", "spec.ngram"):
        run_bench(SUITE, target, [method], out, params={"ar.greedy": short, method: short}, limit=1, warmup=False)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    runs = {r["method"]: r["run"] for r in rows}
    assert len(set(runs.values())) == 2 and runs["ar.greedy"] == runs["spec.pld"] != runs["spec.ngram"]


def test_run_item_reproduces_a_row_from_python(results, target):
    from fastdecode.bench.evaluate import run_item

    _, out = results
    for row in [r for r in read_rows(out) if r["method"] in ("ar.greedy", "ar.sample")]:
        run = run_item(target, row["task"], row["item"], row["method"], test_seed=row["seed"],
                       **SHORT[row["method"]])
        assert run.prompt == format_prompt(run.item.prompt) == format_prompt(
            TASKS[row["task"]].items(row["seed"], row["item"] + 1)[-1].prompt)
        assert run.result.token_ids == row["token_ids"] and run.score == row["score"]
    with pytest.raises(BenchError, match="item number"):
        run_item(target, "lists.sort", -1)
    with pytest.raises(BenchError, match="not a test seed"):
        run_item(target, "lists.sort", 0, test_seed=5)
