"""Code completion (`code.complete`): continue Python standard-library source.

Modules are split: `TEST_MODULES` are held out for evaluation, every other pure-Python stdlib
module is for training. Test items come from a committed pool (`data/code_test.jsonl`, built
once by `build_code_test_set`) so they do not depend on the local Python version; train items
are cut from the running interpreter's stdlib.

Run `python -m fastdecode.bench.tasks.code` to rebuild the pool.
"""

from __future__ import annotations

import bisect
import difflib
import json
import os
import platform
import random
import sysconfig
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Iterator, Optional, Union

from .base import DEFAULT_TEST_SEED, Item, Task, check_count, check_seed, is_test_seed, task_rng, token_budget

NAME = "code.complete"
PROMPT_PREFIX = "Continue the Python code:\n"
# Held-out modules: single pure-Python files present in CPython 3.10-3.13.
TEST_MODULES = (
    "calendar", "colorsys", "difflib", "fnmatch", "fractions", "graphlib", "heapq", "ipaddress",
    "pprint", "queue", "sched", "shlex", "statistics", "string", "textwrap",
)  # fmt: skip
EXCLUDED_PACKAGES = frozenset(
    {"test", "tests", "idlelib", "lib2to3", "encodings", "turtledemo", "pydoc_data", "ensurepip",
     "__phello__"}
)
CONTEXT_CHARS = 500  # most context characters (whole lines)
MIN_CONTEXT_CHARS = 100
REFERENCE_CHARS = (150, 300)  # reference length range (whole lines)
TEST_ITEMS_PER_MODULE = 20  # 15 modules x 20 = 300 test items
TEST_POOL = "data/code_test.jsonl"
MAX_TRIES = 10_000


def similarity(reference: str, output: str) -> float:
    """The score: difflib ratio 2*M/T of `output[:len(reference)]` against `reference`.

    Exact character comparison (whitespace included, no junk heuristic); 1.0 only for an
    output that starts with the reference.
    """
    if not reference:
        return float(not output)
    matcher = difflib.SequenceMatcher(None, output[: len(reference)], reference, autojunk=False)
    return matcher.ratio()


def first_line_exact(item: Item, output: str) -> float:
    """1.0 when the output's first line equals the reference's (trailing whitespace ignored)."""
    first = output.split("\n", 1)[0].rstrip()
    return float(first == item.reference.split("\n", 1)[0].rstrip())


def _stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _module_name(rel: Path) -> Optional[str]:
    """Dotted name of a stdlib file, or None when it is excluded from the corpus."""
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if not parts or any(not part.isidentifier() for part in parts):
        return None  # site-packages, config-3.x-..., lib-dynload
    if parts[0] in TEST_MODULES or EXCLUDED_PACKAGES.intersection(parts):
        return None
    if parts[-1].startswith(("test_", "_sysconfigdata")):
        return None
    return ".".join(parts)


@lru_cache(maxsize=1)
def _train_files() -> tuple[tuple[tuple[str, Path], ...], tuple[int, ...]]:
    """(module, path) of every training module, and cumulative file sizes for weighted choice."""
    root, files, sizes = _stdlib_dir(), [], []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d.isidentifier() and d not in EXCLUDED_PACKAGES)
        for filename in sorted(filenames):
            path = Path(dirpath, filename)
            module = _module_name(path.relative_to(root)) if filename.endswith(".py") else None
            if module is not None and path.stat().st_size > 0:
                files.append((module, path))
                sizes.append(path.stat().st_size)
    cumulative = [0] * len(sizes)
    for i, size in enumerate(sizes):
        cumulative[i] = size + (cumulative[i - 1] if i else 0)
    return tuple(files), tuple(cumulative)


@lru_cache(maxsize=256)
def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def training_sources() -> Iterator[tuple[str, str]]:
    """(module name, source) of every training module of the running interpreter's stdlib."""
    for module, path in _train_files()[0]:
        yield module, path.read_text(encoding="utf-8", errors="replace")


def _printable(text: str) -> bool:
    return all(ch == "\n" or " " <= ch <= "~" for ch in text)


def cut_window(lines: list[str], start: int) -> Optional[tuple[str, str]]:
    """(context, reference) around line `start`, or None when that line makes a poor item.

    The reference is whole lines from `start` until it holds at least 150 characters (at most
    300); the context is as many whole preceding lines as fit in 500 characters.
    """
    if not lines[start].strip():
        return None
    end, size = start, 0
    while end < len(lines) and size < REFERENCE_CHARS[0]:
        size, end = size + len(lines[end]) + 1, end + 1
    reference = "\n".join(lines[start:end]).rstrip()
    begin, size = start, 0
    while begin > 0 and size + len(lines[begin - 1]) + 1 <= CONTEXT_CHARS:
        begin, size = begin - 1, size + len(lines[begin - 1]) + 1
    context = "\n".join(lines[begin:start])
    low, high = REFERENCE_CHARS
    if not low <= len(reference) <= high or len(context) < MIN_CONTEXT_CHARS:
        return None
    return (context, reference) if _printable(context + reference) else None


class CodeCompletionTask(Task):
    """Continue stdlib source; scored by `similarity` in [0, 1]."""

    def __init__(self) -> None:
        super().__init__(NAME, deterministic=False, max_new_tokens=token_budget(REFERENCE_CHARS[1]))

    def code_item(self, module: str, line: int, context: str, reference: str, **extra: str) -> Item:
        """An item whose reference starts at 1-based `line` of `module`."""
        return self.item(PROMPT_PREFIX + context, reference, module=module, line=line, **extra)

    def make_item(self, rng: random.Random) -> Item:
        """A train item: a random window of a training module (weighted by file size)."""
        files, cumulative = _train_files()
        for _ in range(MAX_TRIES):
            index = bisect.bisect_right(cumulative, rng.randrange(cumulative[-1]))
            module, path = files[index]
            lines = _read(path).split("\n")
            start = rng.randrange(len(lines))
            window = cut_window(lines, start)
            if window is not None:
                return self.code_item(module, start + 1, *window)
        raise RuntimeError("could not cut a code window from the stdlib")

    def items(self, seed: int, n: int) -> list[Item]:
        """Train seeds cut live stdlib source; test seeds read the committed pool.

        DEFAULT_TEST_SEED gives the pool in file order; other test seeds a seeded permutation.
        """
        if not is_test_seed(seed):
            return super().items(seed, n)
        pool = load_test_pool()
        if check_count(n) > len(pool):
            raise ValueError(f"{NAME} has {len(pool)} test items; asked for {n}")
        order = list(range(len(pool)))
        if check_seed(seed) != DEFAULT_TEST_SEED:
            task_rng(NAME, seed).shuffle(order)
        return [pool[i] for i in order[:n]]

    def score(self, item: Item, output: str) -> float:
        return similarity(item.reference, output)


@lru_cache(maxsize=1)
def load_test_pool() -> tuple[Item, ...]:
    """The committed held-out items."""
    text = resources.files(__package__).joinpath(TEST_POOL).read_text(encoding="utf-8")
    return tuple(TASK.code_item(**json.loads(line)) for line in text.splitlines() if line.strip())


def build_code_test_set(path: Union[str, Path, None] = None) -> Path:
    """Cut 20 windows from each held-out module of this interpreter and write them, shuffled, as JSONL.

    Rows hold module, line, context, reference and python (the version they were cut from).
    """
    path = Path(path) if path is not None else Path(__file__).with_name("data") / "code_test.jsonl"
    rng = task_rng(f"{NAME}:test-pool", 0)
    version = platform.python_version()
    rows = []
    for module in TEST_MODULES:
        lines = _read(_stdlib_dir() / f"{module}.py").split("\n")
        starts = [i for i in range(len(lines)) if cut_window(lines, i) is not None]
        for start in sorted(rng.sample(starts, TEST_ITEMS_PER_MODULE)):
            context, reference = cut_window(lines, start)  # type: ignore[misc]
            rows.append({"module": module, "line": start + 1, "context": context,
                         "reference": reference, "python": version})  # fmt: skip
    rng.shuffle(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


TASK = CodeCompletionTask()
TASKS = (TASK,)

if __name__ == "__main__":
    build_code_test_set()
