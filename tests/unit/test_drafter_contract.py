"""The drafter contract (`speculative/drafter.py`): every `spec.*` method's drafter declares every capability of
the `Drafter` protocol, so the driver reads them as attributes and never probes; `drafters/` holds exactly one
file per registered method, and shared drafting code lives beside the driver."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from fastdecode.engine import encode_batch
from fastdecode.registry import Method, RunContext, list_methods
from fastdecode.speculative import drafters, driver
from fastdecode.speculative.drafter import BaseDrafter, Drafter

CAPABILITIES = {"forwards", "needs_hidden", "hidden_layers", "tree_drafts", "shares_target_cache", "bind"}
CALLS = {"propose", "reads", "observe", "finish"}
FLAGS = ("needs_hidden", "tree_drafts", "shares_target_cache")
DRAFTERS = Path(drafters.__file__).parent
# image-only methods (spec.lantern, spec.gsd) draft with spec.sjd's window, checked on the text model through it
ALL_SPEC = [m for m in list_methods() if m.name.startswith("spec.")]
SPEC = [m for m in ALL_SPEC if not m.images_only]


def protocol_members() -> set[str]:
    """The names the Drafter protocol declares: its annotated attributes, its methods and properties."""
    own = {n for n, v in vars(Drafter).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    return own | set(Drafter.__annotations__)


def test_the_protocol_declares_every_capability_and_the_base_class_gives_each_a_default():
    assert protocol_members() == CAPABILITIES | CALLS
    for name in protocol_members():
        assert name in vars(BaseDrafter), f"BaseDrafter gives no default for {name}"


def drafter_of(method: Method, causal, diffusion, monkeypatch) -> object:
    """Run the method's driver with `speculative()` replaced by a stub that keeps the drafter factory; build one."""
    made = []

    def keep(model, batch, cfg, ctx, new_drafter):
        made.append(new_drafter)
        return iter(())

    monkeypatch.setattr(sys.modules[method.driver.__module__], "speculative", keep)
    draft = (diffusion if method.draft_kind == "diffusion" else causal) if method.needs_draft else None
    method.driver(causal, encode_batch(causal, "the quick brown fox", 8), method.config(), RunContext(draft=draft))
    assert len(made) == 1, f"{method.name} did not run through speculative()"
    return made[0](None)


@pytest.mark.parametrize("method", SPEC, ids=[m.name for m in SPEC])
def test_every_spec_drafter_declares_every_capability(method, causal, diffusion, monkeypatch):
    d = drafter_of(method, causal, diffusion, monkeypatch)
    assert isinstance(d, Drafter), f"{type(d).__name__} lacks part of the Drafter protocol"
    for name in protocol_members():
        assert hasattr(type(d), name), f"{type(d).__name__} declares no {name} (subclass BaseDrafter)"
    for flag in FLAGS:
        assert isinstance(getattr(d, flag), bool), f"{type(d).__name__}.{flag} is not a bool"
    assert isinstance(d.forwards, int) and d.forwards == 0
    assert isinstance(d.hidden_layers, tuple) and all(isinstance(i, int) for i in d.hidden_layers)
    for name in CALLS | {"bind"}:
        assert callable(getattr(d, name))


def registered_in(path: Path) -> list[str]:
    """The method names a file registers with `@register_spec("...")` (or the plain `@register("...")`)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("register", "register_spec") and node.args:
            arg = node.args[0]
            names.append(arg.value if isinstance(arg, ast.Constant) else ast.dump(arg))
    return names


def test_drafters_holds_one_file_per_registered_method():
    files = sorted(p for p in DRAFTERS.glob("*.py") if p.name != "__init__.py")
    for path in files:
        names = registered_in(path)
        assert len(names) == 1 and names[0].startswith("spec."), (
            f"drafters/{path.name} registers {names}: one spec.* method per file; shared drafting code lives beside "
            "the driver in fastdecode/speculative/"
        )
    modules = {f"{drafters.__name__}.{p.stem}" for p in files}
    assert {m.driver.__module__ for m in ALL_SPEC} == modules
    assert len(ALL_SPEC) == len(files)


def test_the_driver_reads_capabilities_without_probing():
    source = Path(driver.__file__).read_text()
    assert "type: ignore" not in source
    assert not [line for line in source.splitlines() if "getattr" in line and "drafter" in line]
