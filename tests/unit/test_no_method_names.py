"""`serve/` and `constraints/` never know a method by its name: what they need (how a request joins a running batch,
whether its events count drafts, which constraints it honours) is declared where the method registers. This test
reads their source and fails on a method name or family prefix used in a test: `startswith` / `endswith` on a
string, a comparison (`==`, `!=`, `in`, `not in`) with a method name, or a collection of method names."""

from __future__ import annotations

import ast
from pathlib import Path

import fastdecode

PACKAGES = ("serve", "constraints")
ROOT = Path(fastdecode.__file__).parent


def _names() -> set[str]:
    """Every registered method name and every family prefix ("spec.", "dlm.", ...; bare "spec" too)."""
    names = {m.name for m in fastdecode.methods()}
    families = {n.split(".")[0] for n in names}
    return names | families | {f + "." for f in families}


def _literals(node: ast.AST) -> list[str]:
    """The string constants in an expression (a tuple, list, set or dict of them included)."""
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _offences(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("startswith", "endswith", "removeprefix", "partition", "split"):
            hits = [s for arg in node.args for s in _literals(arg) if s in names]
            if hits or node.func.attr in ("startswith", "endswith") and _mentions_method(node.func.value):
                found.append((node.lineno, f".{node.func.attr}(...) on a method name"))
        elif isinstance(node, ast.Compare):
            hits = [s for part in [node.left, *node.comparators] for s in _literals(part) if s in names]
            if hits:
                found.append((node.lineno, f"compares with {hits}"))
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            hits = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names]
            if len(hits) >= 1 and len(hits) == len(node.elts):
                found.append((node.lineno, f"a collection of method names {hits}"))
        elif isinstance(node, ast.Dict):
            hits = [k.value for k in node.keys if isinstance(k, ast.Constant) and k.value in names]
            if hits:
                found.append((node.lineno, f"a table keyed by method names {hits}"))
    return found


def _mentions_method(node: ast.AST) -> bool:
    """`x.method.startswith(...)`, `name.startswith(...)`, `spec.name.startswith(...)`: a method's name."""
    text = ast.unparse(node)
    return text.endswith(("method", "name"))


def test_serve_and_constraints_never_test_a_method_name():
    names = _names()
    offences = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, what in _offences(ast.parse(path.read_text()), names):
                offences.append(f"{path.relative_to(ROOT.parent)}:{line}: {what}")
    assert not offences, "declare it on the method (registry.register) instead:\n" + "\n".join(offences)


def test_the_check_finds_the_name_tests_it_forbids():
    names = _names()
    for source in ('CONTINUOUS = ("ar.greedy", "ar.sample")', 'ok = req.method.startswith("spec.")',
                   'x = method in NOT_JOINABLE or method == "spec.sparse_self"', 'T = {"llamacpp.": "why"}',
                   'ok = name.startswith(prefix)'):
        assert _offences(ast.parse(source), names), source
    for source in ('method: str = "ar.greedy"', 'resolve(model, "ar.sample")', 'ok = text.startswith(row.sent)'):
        assert not _offences(ast.parse(source), names), source
