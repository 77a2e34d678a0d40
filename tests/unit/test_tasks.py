"""Tests for fastdecode.bench.tasks: generators are seeded and prefix-stable, references score 1,
and every scorer accepts the right answers and rejects the wrong ones."""

from __future__ import annotations

import hashlib
import json
import random

import pytest

from fastdecode.bench.tasks import (
    DEFAULT_TEST_SEED,
    TASKS,
    TEST_SEED_START,
    TRAIN_SEEDS,
    Item,
    UnknownTaskError,
    code,
    format_prompt,
    get_task,
    is_test_seed,
    list_tasks,
    puzzles,
)
from fastdecode.bench.tasks._lists import parse_list, render_list
from fastdecode.bench.tasks.base import task_rng
from fastdecode.bench.tasks.lists import last_name

ALL = list(TASKS.values())
IDS = list(TASKS)
TRAIN_SEED = 7


def first(name: str, seed: int = TRAIN_SEED, n: int = 50) -> list[Item]:
    return get_task(name).items(seed, n)


def score(item: Item, output: str) -> float:
    return get_task(item.task).score(item, output)


# --- base and registry -------------------------------------------------------------------------


def test_seed_constants_and_prompt_format() -> None:
    assert TRAIN_SEEDS.stop == TEST_SEED_START == DEFAULT_TEST_SEED
    assert is_test_seed(DEFAULT_TEST_SEED) and is_test_seed(TEST_SEED_START + 5)
    assert not is_test_seed(0) and not is_test_seed(TRAIN_SEEDS[-1])
    assert format_prompt("Copy {x}: [A]") == "Q: Copy {x}: [A]\nA: "


def test_rng_is_seeded_from_sha256_not_hash() -> None:
    digest = hashlib.sha256(b"lists.copy:3").digest()
    expected = random.Random(int.from_bytes(digest[:8], "big")).random()
    assert task_rng("lists.copy", 3).random() == expected


@pytest.mark.parametrize("seed, n", [(-1, 3), (0, 0), (0, -2)])
def test_bad_seed_or_count_raises(seed: int, n: int) -> None:
    with pytest.raises(ValueError, match="seed|n "):
        get_task("lists.copy").items(seed, n)
    with pytest.raises(ValueError):
        get_task("code.complete").items(seed, n)


def test_registry() -> None:
    assert len(TASKS) == 17
    assert list_tasks() == IDS
    assert list_tasks("letters") == ["letters.copy", "letters.reverse", "letters.sort", "letters.repeat"]
    assert list_tasks("puzzles") == ["puzzles.sudoku", "puzzles.latin_square"]
    assert all(name.startswith(TASKS[name].family + ".") for name in TASKS)
    with pytest.raises(ValueError, match="families"):
        list_tasks("maths")


def test_unknown_task_lists_close_names() -> None:
    with pytest.raises(KeyError) as info:
        get_task("lists.sorted")
    assert isinstance(info.value, (UnknownTaskError, ValueError))
    assert "lists.sort" in str(info.value) and not str(info.value).startswith('"')


# --- properties of every task --------------------------------------------------------------------


@pytest.mark.parametrize("task", ALL, ids=IDS)
def test_items_are_deterministic_and_prefix_stable(task) -> None:
    for seed in (TRAIN_SEED, DEFAULT_TEST_SEED, DEFAULT_TEST_SEED + 1):
        items = task.items(seed, 20)
        assert items == task.items(seed, 20)
        assert items[:7] == task.items(seed, 7)
        assert all(item.task == task.name for item in items)
    assert [i.prompt for i in task.items(0, 10)] != [i.prompt for i in task.items(1, 10)]


@pytest.mark.parametrize("task", ALL, ids=IDS)
def test_reference_scores_one(task) -> None:
    for seed in (TRAIN_SEED, DEFAULT_TEST_SEED):
        for item in task.items(seed, 150):
            assert task.score(item, item.reference) == 1.0, item
            assert task.score(item, item.reference + "\n") == 1.0, item


@pytest.mark.parametrize("task", ALL, ids=IDS)
def test_garbage_scores_zero(task) -> None:
    for item in task.items(TRAIN_SEED, 20):
        assert task.score(item, "") == 0.0
        assert task.score(item, "I do not know.") <= (0.3 if task.family == "code" else 0.0)


@pytest.mark.parametrize("task", ALL, ids=IDS)
def test_items_are_json_serialisable(task) -> None:
    for item in task.items(TRAIN_SEED, 10):
        assert Item.from_dict(json.loads(json.dumps(item.to_dict()))) == item


@pytest.mark.parametrize("task", ALL, ids=IDS)
def test_budget_fits_references(task) -> None:
    longest = max(len(item.reference) for item in task.items(TRAIN_SEED, 200))
    assert longest <= 2 * task.max_new_tokens <= 8 * longest + 64


@pytest.mark.parametrize("task", ALL, ids=IDS)
def test_test_items_rarely_appear_in_train_items(task) -> None:
    """Documented overlap: 0 of 100 test prompts appear among 300 train prompts for every task
    today; the bound allows a rare collision (short letter lists) without flaking."""
    test = {item.prompt for item in task.items(DEFAULT_TEST_SEED, 100)}
    train = {item.prompt for seed in (0, 1, 2) for item in task.items(seed, 100)}
    assert len(test & train) <= 2


# --- lists ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ['["A B","C D"]', '[ "A B" , "C D" ]', 'Answer: ["A B", "C D"]', "[A B, C D]", "['A B', 'C D',]",
     'old: ["X Y"] new: ["A B", "C D"]', '["A B", "C D"'],
)  # fmt: skip
def test_parse_list_is_robust_to_spacing(text: str) -> None:
    assert parse_list(text) == ["A B", "C D"]


def test_parse_list_edge_cases() -> None:
    assert parse_list("no list here") is None
    assert parse_list("[]") == []
    assert render_list(["Ann Lee", "Bob Moss"]) == '["Ann Lee", "Bob Moss"]'
    assert render_list(["A", "C"], quote=False) == "[A, C]"


def test_people_lists_are_well_formed() -> None:
    for item in first("lists.copy", n=200):
        people = item.data["input"]
        assert 3 <= len(people) <= 8
        assert len({last_name(p) for p in people}) == len(people)
        assert all(len(p.split()) == 2 and p.istitle() for p in people)


def test_sort_follows_last_name_and_first_name_order_scores_zero() -> None:
    checked = 0
    for item in first("lists.sort", n=100):
        people = item.data["input"]
        assert parse_list(item.reference) == sorted(people, key=last_name)
        by_first = sorted(people)
        if by_first != sorted(people, key=last_name):
            assert score(item, render_list(by_first)) == 0.0
            checked += 1
    assert checked > 50


def test_shuffle_scorer() -> None:
    for item in first("lists.shuffle"):
        people = item.data["input"]
        assert score(item, render_list(people)) == 0.0
        assert score(item, render_list(people[1:] + people[:1])) == 1.0
        assert score(item, render_list(people[1:])) == 0.0
        assert score(item, render_list(people[::-1] + people[:1])) == 0.0


def test_insert_random_scorer() -> None:
    for item in first("lists.insert_random", n=20):
        people, word = item.data["input"], item.data["word"]
        assert word not in people
        for i in range(len(people) + 1):
            assert score(item, render_list([*people[:i], word, *people[i:]])) == 1.0
        assert score(item, render_list([word, *people, word])) == 0.0
        assert score(item, render_list(["Zed Nobody", *people])) == 0.0
        assert score(item, render_list([word, *people[1:]])) == 0.0


def test_remove_random_scorer() -> None:
    for item in first("lists.remove_random", n=20):
        people = item.data["input"]
        for i in range(len(people)):
            assert score(item, render_list([*people[:i], *people[i + 1 :]])) == 1.0
        assert score(item, render_list(people[2:])) == 0.0
        assert score(item, render_list(people)) == 0.0
        assert score(item, render_list(people[-2::-1])) == 0.0


def test_replace_random_scorer() -> None:
    for item in first("lists.replace_random", n=20):
        people, word = item.data["input"], item.data["word"]
        for i in range(len(people)):
            assert score(item, render_list([*people[:i], word, *people[i + 1 :]])) == 1.0
        assert score(item, render_list([word, word, *people[2:]])) == 0.0
        assert score(item, render_list(["Zed Nobody", *people[1:]])) == 0.0
        assert score(item, render_list(people)) == 0.0


@pytest.mark.parametrize("name", ["lists.insert_index", "lists.remove_index", "lists.replace_index"])
def test_index_tasks_count_from_zero(name: str) -> None:
    for item in first(name):
        index = item.data["index"]
        assert f"position {index} (counting from 0)" in item.prompt
        answer = parse_list(item.reference)
        people = item.data["input"]
        if name == "lists.insert_index":
            assert answer[index] == item.data["word"] and len(answer) == len(people) + 1
        elif name == "lists.remove_index":
            assert people[index] not in answer and len(answer) == len(people) - 1
        else:
            assert answer[index] == item.data["word"] and people[index] not in answer


def test_index_tasks_reject_one_based_answers() -> None:
    for item in first("lists.replace_index"):
        people, index = item.data["input"], item.data["index"]
        if index + 1 < len(people):
            wrong = [*people[: index + 1], item.data["word"], *people[index + 2 :]]
            assert score(item, render_list(wrong)) == 0.0


def test_exact_list_tasks_reject_near_misses() -> None:
    for name in ("lists.copy", "lists.reverse", "lists.insert_index", "lists.remove_index"):
        for item in first(name, n=20):
            answer = parse_list(item.reference)
            assert score(item, render_list(answer[:-1])) == 0.0
            assert score(item, render_list(answer[1:] + answer[:1])) == 0.0


# --- letters -------------------------------------------------------------------------------------


def test_letter_lists_and_quotes() -> None:
    for item in first("letters.copy", n=100):
        letters = item.data["input"]
        assert 4 <= len(letters) <= 16 and all(x.isupper() and len(x) == 1 for x in letters)
        assert score(item, render_list(letters, quote=True)) == 1.0
        assert score(item, "[" + ",".join(letters) + "]") == 1.0


def test_letters_sort_and_repeat() -> None:
    for item in first("letters.sort"):
        assert parse_list(item.reference) == sorted(item.data["input"])
    for item in first("letters.repeat"):
        k, letters = item.data["k"], item.data["input"]
        assert k in (2, 3) and f"{k} times" in item.prompt
        assert parse_list(item.reference) == [x for x in letters for _ in range(k)]
        assert score(item, render_list(letters * k, quote=False)) == float(len(set(letters)) == 1)
        other = 5 - k
        assert score(item, render_list([x for x in letters for _ in range(other)], quote=False)) == 0.0
    repeat = get_task("letters.repeat").items(TRAIN_SEED, 1)[0]
    assert "[A, B] becomes [A, A" in repeat.prompt


# --- puzzles -------------------------------------------------------------------------------------


def test_all_solved_grids() -> None:
    grids = puzzles.solved_grids()
    assert len(grids) == 288 == len(set(grids))
    for grid in grids[:20]:
        assert all(grid[cell] not in {grid[p] for p in puzzles.PEERS[cell]} for cell in range(16))


def test_sudoku_puzzles_have_unique_solutions() -> None:
    for item in first("puzzles.sudoku", DEFAULT_TEST_SEED, 100):
        puzzle, solution = item.data["puzzle"], item.data["solution"]
        assert 4 <= puzzle.count(0) <= 10
        assert list(puzzles.iter_solutions(puzzle)) == [tuple(solution)]
        assert all(p in (0, s) for p, s in zip(puzzle, solution, strict=True))
        assert item.prompt.endswith(puzzles.grid_to_text(puzzle))


def test_sudoku_scorer() -> None:
    for item in first("puzzles.sudoku", n=20):
        rows = item.reference.split("\n")
        assert score(item, "\n".join(" ".join(row) for row in rows)) == 1.0
        assert score(item, "\n".join(",".join(row) for row in rows)) == 1.0
        assert score(item, "Here:\n" + item.reference + "\nDone.") == 1.0
        wrong = rows[0][:-1] + str(int(rows[0][-1]) % 4 + 1)
        assert score(item, "\n".join([wrong, *rows[1:]])) == 0.0
        assert score(item, "\n".join(rows[:3])) == 0.0
        assert score(item, "".join(rows)) == 0.0


def test_latin_square_scorer() -> None:
    for item in first("puzzles.latin_square", n=20):
        rows = [line.split(",") for line in item.reference.split("\n")]
        symbols = item.data["symbols"]
        assert puzzles.is_latin(rows, symbols) and "[" + ", ".join(symbols) + "]" in item.prompt
        other = [list(col) for col in zip(*rows[::-1], strict=True)]  # rotated: a different valid square
        assert score(item, "\n".join(",".join(r) for r in other)) == 1.0
        assert score(item, "\n".join(", ".join(r) for r in rows)) == 1.0
        assert score(item, "\n".join(",".join(r) for r in [rows[0], *rows[:3]])) == 0.0  # repeated row
        assert score(item, "\n".join(",".join(r) for r in rows[:3])) == 0.0
        bad = [[c.lower() if c.isalpha() else "z" for c in r] for r in rows]
        assert score(item, "\n".join(",".join(r) for r in bad)) == 0.0


# --- code ----------------------------------------------------------------------------------------


def test_code_test_pool() -> None:
    pool = code.load_test_pool()
    assert len(pool) == 300
    assert code.resources.files(code.__package__).joinpath(code.TEST_POOL).stat().st_size < 400_000
    modules = [item.data["module"] for item in pool]
    assert {m: modules.count(m) for m in set(modules)} == {m: 20 for m in code.TEST_MODULES}
    for item in pool:
        context = item.prompt.removeprefix(code.PROMPT_PREFIX)
        assert item.prompt.startswith(code.PROMPT_PREFIX) and len(context) <= 500
        assert 150 <= len(item.reference) <= 300 and item.reference.split("\n")[0].strip()


def test_code_test_seeds_read_the_pool() -> None:
    task, pool = get_task("code.complete"), code.load_test_pool()
    assert task.items(DEFAULT_TEST_SEED, 300) == list(pool)
    other = task.items(DEFAULT_TEST_SEED + 1, 300)
    assert other != list(pool) and sorted(map(repr, other)) == sorted(map(repr, pool))
    with pytest.raises(ValueError, match="300"):
        task.items(DEFAULT_TEST_SEED, 301)


def test_code_train_items_use_train_modules_only() -> None:
    for item in first("code.complete", n=60):
        assert item.data["module"].split(".")[0] not in code.TEST_MODULES
        assert 150 <= len(item.reference) <= 300
        assert len(item.prompt) - len(code.PROMPT_PREFIX) <= 500
    names = {module for module, _ in code._train_files()[0]}
    assert {"argparse", "json", "email.message"} <= names
    assert not names & set(code.TEST_MODULES)
    assert not any(part in code.EXCLUDED_PACKAGES for name in names for part in name.split("."))


def test_training_sources_yield_text() -> None:
    module, text = next(code.training_sources())
    assert module not in code.TEST_MODULES and isinstance(text, str)


def test_code_similarity_and_first_line() -> None:
    item = code.load_test_pool()[0]
    ref = item.reference
    assert code.similarity(ref, ref + "\n    more code") == 1.0
    assert code.similarity(ref, "") == 0.0
    assert 0.3 < code.similarity(ref, ref[: len(ref) // 2]) < 1.0
    assert code.similarity(ref, ref.replace(" ", "")) < 1.0
    line = ref.split("\n")[0]
    assert code.first_line_exact(item, line + "  \nwhatever") == 1.0
    assert code.first_line_exact(item, "x" + line) == 0.0
