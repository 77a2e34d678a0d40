"""The import layering of `fastdecode`, read from the source (imports inside functions included).

- No two units import each other, directly or through a chain: a unit is a top-level package (`bench`, `sparse`, ...)
  or module (`registry`, `engine`, ...) of `fastdecode`.
- No two modules import each other at run time either (imports under `if TYPE_CHECKING:` carry types only).
- The core never imports a family of methods, `bench`, `serve`, `train`, `engine` or `constraints`: a method plugs
  into the core, the core never reaches for a method.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import fastdecode

ROOT = Path(fastdecode.__file__).parent
CORE = {"models", "cache", "attention", "registry", "sampling", "types", "config", "errors", "stats", "plugins",
        "session"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes inside `if TYPE_CHECKING:` blocks."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            ids.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return ids


def _imports(path: Path) -> list[tuple[str, int]]:
    """(absolute module imported, line) for every run-time import of `path` naming a fastdecode module."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_only(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from . import x` may name a submodule: count it as one when such a file exists
            subs = [f"{module}.{a.name}" for a in node.names if _exists(f"{module}.{a.name}")]
            found += [(m, node.lineno) for m in (subs or [module])]
    return [(m, line) for m, line in found if m == "fastdecode" or m.startswith("fastdecode.")]


def _exists(module: str) -> bool:
    rel = Path(*module.split(".")[1:])
    return (ROOT / rel).with_suffix(".py").exists() or (ROOT / rel / "__init__.py").exists()


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "fastdecode"  # the root: the public API


def _edges(unit_of=_unit) -> dict[str, dict[str, str]]:
    """source -> target -> where (file:line of one import making the edge)."""
    edges: dict[str, dict[str, str]] = defaultdict(dict)
    for path in sorted(ROOT.rglob("*.py")):
        source = _module_name(path)
        for target, line in _imports(path):
            a, b = unit_of(source), unit_of(target)
            if a != b:
                edges[a].setdefault(b, f"{path.relative_to(ROOT.parent)}:{line}")
    return edges


def _cycles(edges: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(set(edges) | {w for targets in edges.values() for w in targets}):
        if v not in index:
            visit(v)
    return out


def _explain(cycles: list[list[str]], edges: dict[str, dict[str, str]]) -> str:
    lines = []
    for comp in cycles:
        lines.append(" <-> ".join(comp))
        lines += [f"    {a} -> {b}  ({edges[a][b]})" for a in comp for b in comp if b in edges.get(a, {})]
    return "\n".join(lines)


def test_units_form_no_cycle() -> None:
    edges = _edges()
    cycles = _cycles(edges)
    assert not cycles, "import cycles between fastdecode's packages:\n" + _explain(cycles, edges)


def test_modules_form_no_runtime_cycle() -> None:
    edges = _edges(unit_of=lambda m: m)
    # a package's __init__ that re-exports its modules, imported back by them, is one unit in all but name
    cycles = [c for c in _cycles(edges) if not _package_and_its_modules(c)]
    assert not cycles, "run-time import cycles between fastdecode's modules:\n" + _explain(cycles, edges)


def _package_and_its_modules(comp: list[str]) -> bool:
    shortest = min(comp, key=len)
    return all(m == shortest or m.startswith(shortest + ".") and m.count(".") == shortest.count(".") + 1
               for m in comp) and _is_package(shortest)


def _is_package(module: str) -> bool:
    return (ROOT / Path(*module.split(".")[1:]) / "__init__.py").exists()


def test_core_imports_no_family() -> None:
    edges = _edges()
    bad = [f"{a} -> {b}  ({where})" for a in sorted(CORE) for b, where in sorted(edges.get(a, {}).items())
           if b not in CORE]
    assert not bad, "the core imports outside the core:\n" + "\n".join(bad)


def test_the_reader_sees_every_kind_of_import() -> None:
    """The checks above are only as good as `_imports`: it must see relative, absolute and in-function imports."""
    found = {m for m, _ in _imports(ROOT / "engine.py")}
    assert "fastdecode.registry" in found  # `from .registry import ...` at the top
    assert "fastdecode.constraints" in found  # imported inside a function
    edges = _edges()
    assert "bench" in edges["cli"] and "engine" in edges["bench"]
