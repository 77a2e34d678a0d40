"""docs/adding-a-method.md against the tree: the files each checklist names exist (a placeholder NAME / KIND / FAMILY
stands for a file of that folder), a rule-based method takes two files and a trained head four, and each folder of
one-file-per-method plug-ins holds exactly that."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "adding-a-method.md").read_text(encoding="utf-8")
PLACEHOLDER = re.compile(r"NAME|KIND|FAMILY")


def checklists() -> dict[str, list[str]]:
    """Heading -> the files of its `Files:` line."""
    found: dict[str, list[str]] = {}
    for section in re.split(r"^## ", DOC, flags=re.M)[1:]:
        title = section.splitlines()[0].strip()
        line = next((x for x in section.splitlines() if x.startswith("Files: ")), None)
        if line is not None:
            found[title] = re.findall(r"`([^`]+)`", line)
    return found


def test_every_plugin_kind_has_a_checklist_of_files():
    titles = " | ".join(checklists())
    for kind in ("speculative drafter", "diffusion policy", "sparse attention rule", "trained head", "benchmark task"):
        assert kind in titles, kind


@pytest.mark.parametrize("title", sorted(checklists()))
def test_the_files_a_checklist_names_exist(title):
    for path in checklists()[title]:
        if PLACEHOLDER.search(path):
            folder = ROOT / Path(path).parent
            assert folder.is_dir(), f"{title}: {path}: no folder {folder}"
            assert any(folder.glob("*" + Path(path).suffix)), f"{title}: {path}: no such file in {folder}"
        else:
            assert (ROOT / path).is_file(), f"{title}: {path} does not exist"


def test_two_files_for_a_rule_based_method_four_for_a_trained_head():
    lists = checklists()
    for title, files in lists.items():
        if "trained head" in title:
            assert len(files) == 4, files
        elif title.startswith(("A speculative drafter", "A diffusion policy", "A sparse attention rule")):
            assert len(files) == 2 and files[-1] == "docs/methods.md", files


def test_the_contracts_the_table_names_exist():
    table = DOC.split("| kind |", 1)[1].split("\n\n", 1)[0]
    for path in re.findall(r"`([a-z_/]+\.py)`", table):
        assert (ROOT / "fastdecode" / path).is_file(), path


def registrations(path: Path) -> list[str]:
    """Method names a file registers through `register` or a family's `register_*` helper (not `register_rule`)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("register", "register_spec", "register_dlm")
                and node.args and isinstance(node.args[0], ast.Constant)):
            names.append(node.args[0].value)
    return names


@pytest.mark.parametrize("folder", ["speculative/drafters", "diffusion/policies"])
def test_one_method_per_file(folder):
    for path in sorted((ROOT / "fastdecode" / folder).glob("*.py")):
        if path.name != "__init__.py":
            assert len(registrations(path)) == 1, f"{folder}/{path.name}: {registrations(path)}"
