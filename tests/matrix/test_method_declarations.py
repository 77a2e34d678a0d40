"""What every registered method declares instead of being known by its name: how its requests join a running batch
(`session`, a `fastdecode.session.Session` factory), whether its events count drafts, and which constraints it
honours. The declarations must hold on a tiny model: each factory gives a working Session, each refusal names its
fix."""

from __future__ import annotations

import pytest
import torch

import fastdecode
from fastdecode import constraints
from fastdecode.ar.driver import ARSession
from fastdecode.config import build_config
from fastdecode.constraints import support
from fastdecode.errors import IncompatibleMethodError
from fastdecode.registry import RunContext
from fastdecode.session import Session
from fastdecode.speculative.driver import SpecSession

# image-only methods join on image models (tests/image/); this file drives the tiny text model
JOINING = [m.name for m in fastdecode.methods() if m.session is not None and not m.images_only]
SPARSE = "streaming:budget=8,sinks=1,recent=4"


def _open(name: str, causal, diffusion=None, slots: int = 2, **params) -> Session | None:
    """The method's session on the tiny causal model (drafting for itself, or with the tiny MDLM as its draft)."""
    method = fastdecode.get_method(name)
    cfg = build_config(method.config, {"max_new_tokens": 8, **params}, name)
    draft = (diffusion if method.draft_kind == "diffusion" else causal) if method.needs_draft else None
    assert method.session is not None
    return method.session(causal, cfg, RunContext(draft=draft), slots)


def test_the_joining_methods_are_declared():
    spec = {m.name for m in fastdecode.methods() if m.name.startswith("spec.")}
    texts = {m.name for m in fastdecode.methods() if not m.images_only}
    assert set(JOINING) == {"ar.greedy", "ar.sample"} | (spec & texts) - {"spec.sparse_self"}
    assert all(fastdecode.get_method(n).drafts for n in spec)
    assert not any(m.drafts for m in fastdecode.methods() if m.name not in spec)


@pytest.mark.parametrize("name", JOINING)
def test_each_session_factory_gives_a_session_rows_join(name, causal, diffusion):
    method = fastdecode.get_method(name)
    session = _open(name, causal, diffusion)
    assert isinstance(session, Session)
    assert session.running == 0 and session.room == 2 and session.max_slots == 2
    prompts = ["the quick brown", "def add"]
    for prompt, budget in zip(prompts, (8, 5), strict=True):
        (slot,) = session.join(torch.tensor([causal.encode(prompt)]), max_new_tokens=budget)
    out: dict[int, list[int]] = {}
    while session.running:
        for slot, index, token, _ in session.step():
            assert index == len(out.setdefault(slot, []))
            out[slot].append(token)
        assert all(p >= a >= 0 for p, a in session.counts.values())
    if method.lossless:  # greedy by default: each row gets its own ar.greedy tokens
        for slot, (prompt, budget) in enumerate(zip(prompts, (8, 5), strict=True)):
            assert out[slot] == fastdecode.generate(causal, prompt, "ar.greedy", max_new_tokens=budget).token_ids


@pytest.mark.parametrize("name", ["ar.greedy", "spec.pld"])
def test_a_sparse_attention_rule_declines_joining(name, causal):
    assert _open(name, causal, attention=SPARSE) is None


def test_both_sessions_satisfy_the_protocol_at_run_time(causal):
    assert isinstance(ARSession(causal, build_config(fastdecode.get_method("ar.greedy").config, {}, "ar.greedy"),
                                slots=1), Session)
    assert isinstance(_open("spec.pld", causal), SpecSession)


def test_both_sessions_satisfy_the_protocol_for_mypy(tmp_path):
    """A static check: assigning either session to a `Session` variable type-checks (mypy, the project's config)."""
    api = pytest.importorskip("mypy.api")
    snippet = tmp_path / "sessions.py"
    snippet.write_text(
        "from fastdecode.ar.driver import ARSession\n"
        "from fastdecode.session import Session\n"
        "from fastdecode.speculative.driver import SpecSession\n\n\n"
        "def check(a: ARSession, s: SpecSession) -> None:\n"
        "    first: Session = a\n"
        "    second: Session = s\n"
        "    assert first.room + second.room >= 0\n"
    )
    # the project's own options, so that the cache `make lint`'s `mypy fastdecode` left serves the imports (about
    # 9 s here; --follow-imports=silent, a different option set, re-checked every import: 95 s)
    out, err, rc = api.run(["--no-error-summary", str(snippet)])
    assert rc == 0, out + err


@pytest.mark.parametrize("name", [m.name for m in fastdecode.methods()])
def test_constraint_declarations_are_complete(name):
    declared = fastdecode.get_method(name).constraints
    assert set(declared.sampling) <= {"mask", "gad"}
    if declared.refused:
        assert "use " in declared.refused  # the fix
    elif set(declared.sampling) != {"mask", "gad"}:
        assert "use " in declared.why


@pytest.mark.parametrize("name", ["llamacpp.greedy", "llamacpp.prompt_lookup", "dlm.freedave"])
def test_methods_with_a_loop_of_their_own_refuse_constraints_with_the_fix(name):
    with pytest.raises(IncompatibleMethodError, match=r"cannot apply constraint=: it .*; use "):
        support.check(fastdecode.get_method(name), constraints.regex("a+"))


def test_diffusion_methods_refuse_gad_and_take_the_mask():
    for method in fastdecode.methods("diffusion"):
        if method.constraints.refused:
            continue
        support.check(method, constraints.regex("a+"))
        with pytest.raises(IncompatibleMethodError, match="Grammar-Aligned Decoding.*use sampling='mask'"):
            support.check(method, constraints.regex("a+", sampling="gad"))
    support.check(fastdecode.get_method("spec.dlm_draft"), constraints.regex("a+", sampling="gad"))
