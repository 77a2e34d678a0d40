"""One synchronisation a speculative step (issue #30, docs/gpu.md "One read a step"): on a GPU each read of a device
value (`.item()`, `.tolist()`, a copy to the host, an operation sized by the values) makes the host wait for the
device, so a step should read once: its verdict, with the drafts a drafter left on the device and what it asked of
the logits (`Drafter.reads`). Counted on the simulated device (tests/device_sim.py `counting_reads`), which sees
every such read, per target forward of a 40-token generation less an 8-token one (the prefill and first steps cancel
out), every lossless causal method of the registry found there; and the tokens of that device path equal
`ar.greedy`'s; a batch's rows are read together. A tree whose shape follows from the draft's values (a best-first
tree) is left on the device and read with the verdict (`tree.DeviceTree`). A method that reads otherwise names its
reason below (strict: one that comes down to one read fails here, so that the list is kept true)."""

from __future__ import annotations

import pytest
from device_sim import reads_per_forward, simulated

import fastdecode
from fastdecode.registry import list_methods
from fastdecode.speculative.memory import DrafterMemory

PROMPT = "Sort this"  # 40 tokens without an end of text on the tiny model
CAUSAL = [m.name for m in list_methods() if m.kind == "causal" and m.lossless
          and not m.name.startswith(("hf.", "llamacpp."))]  # (those run another runtime's loop)
MORE = {
    "spec.layerskip": "its default confidence_stop reads each drafted token's confidence, which decides whether to "
                      "draft on (with confidence_stop=0 it reads once: below)",
}
# at a temperature: the verdict's acceptance draws and reads once (`verify_sampling` for a chain,
# `verify_tree_sampling` for a tree, `verify_tree_rsd` for RSD's, with what the drafter asked of the logits); a
# drafter's draws stay on the device (a model's chain, RSD's tree, a best-first tree, Medusa's heads' candidates, a
# diffusion draft filled in one forward). Not listed: a diffusion draft filled in several forwards (`draft_steps` > 1)
# is read once when filled (its in-order prefix, the part verify_sampling may take, has a length of its own)
SAMPLED = [("spec.pld", {}), ("spec.ngram", {}), ("spec.suffix", {}), ("spec.suffix", {"tree": True}),
           ("spec.recycling", {}), ("spec.lookahead", {}), ("spec.jacobi", {}), ("spec.eagle3", {}),
           ("spec.dflash", {}), ("spec.draft_model", {}), ("spec.sparse_self", {}),
           ("spec.layerskip", {"confidence_stop": 0.0, "skip_layers": "1"}), ("spec.rsd", {}),
           ("spec.rsd", {"top_k": 1}), ("spec.eagle3", {"tree": True}), ("spec.medusa", {}),
           ("spec.medusa", {"hydra": True}), ("spec.dyntree", {}), ("spec.dlm_draft", {})]


def waits_per_forward(model, method: str, rows: int = 1, **kw) -> tuple[float, list[int]]:
    """Reads per target forward (a forward serves every row of a batch), and the first row's tokens."""
    per, forwards, out = reads_per_forward(lambda new: fastdecode.generate(
        model, [PROMPT] * rows, method, max_new_tokens=new, memory=DrafterMemory(), **kw))
    assert forwards > 0, f"{method}: the longer generation ran no more target forwards"
    return per["waits"], out[0].token_ids


@pytest.fixture(scope="module")
def on_device(causal_dir, diffusion_dir):
    """The tiny target and diffusion draft on the simulated device; ar.greedy's tokens there. (Each test runs them
    under the simulation again: it ends with its block, here and there.)"""
    with simulated():
        target = fastdecode.load(causal_dir, device="cpu:0")
        drafts = {"causal": target, "diffusion": fastdecode.load(diffusion_dir, device="cpu:0")}
        base = fastdecode.generate(target, PROMPT, "ar.greedy", max_new_tokens=40).token_ids
    return target, drafts, base


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=MORE[n]))
                                  if n in MORE else n for n in CAUSAL])
def test_a_greedy_step_reads_once(on_device, name):
    target, drafts, base = on_device
    method = fastdecode.get_method(name)
    draft = {"draft": drafts[method.draft_kind]} if method.needs_draft else {}
    with simulated():
        waits, tokens = waits_per_forward(target, name, **draft)
    assert tokens == base
    assert waits <= 1.0


@pytest.mark.parametrize("params", [{"tree": True}, {"tree": True, "width": 2, "total_tokens": 6}])
def test_a_grown_tree_is_read_with_its_verdict(on_device, params):
    """EAGLE-3's best-first tree (as spec.dyntree's): the beam is chosen where the head runs, the tree verified
    where it grew."""
    target, _, base = on_device
    with simulated():
        waits, tokens = waits_per_forward(target, "spec.eagle3", **params)
    assert tokens == base and waits <= 1.0


def test_an_early_stop_asked_for_on_a_device_reads_a_level(on_device):
    """`early_stop=True` checks after each level whether the tree is complete: a read a level, the same tokens."""
    target, drafts, base = on_device
    with simulated():
        waits, tokens = waits_per_forward(target, "spec.dyntree", draft=drafts["causal"], early_stop=True)
    assert tokens == base and waits > 2.0


def test_hydra_reads_its_tree_with_its_verdict(on_device):
    target, _, base = on_device
    with simulated():
        waits, tokens = waits_per_forward(target, "spec.medusa", hydra=True)
    assert tokens == base and waits <= 1.0


def test_layerskip_without_its_confidence_stop_reads_once(on_device):
    target, _, base = on_device
    with simulated():
        waits, tokens = waits_per_forward(target, "spec.layerskip", confidence_stop=0.0, skip_layers="1")
    assert tokens == base and waits <= 1.0


@pytest.mark.parametrize("name,params", SAMPLED)
def test_a_sampled_step_reads_once(on_device, name, params):
    target, drafts, _ = on_device
    method = fastdecode.get_method(name)
    draft = {"draft": drafts[method.draft_kind]} if method.needs_draft else {}
    with simulated():
        waits, _ = waits_per_forward(target, name, temperature=1.0, seed=0, **params, **draft)
    assert waits <= 1.0


@pytest.mark.parametrize("name,params", [("spec.pld", {}), ("spec.suffix", {"tree": True}), ("spec.lookahead", {}),
                                         ("spec.draft_model", {}), ("spec.dyntree", {})])
def test_a_batch_reads_once_a_step_for_all_its_rows(on_device, name, params):
    """Three rows in one step: their verdicts (and what their drafters asked) come back in one copy."""
    target, drafts, base = on_device
    draft = {"draft": drafts["causal"]} if fastdecode.get_method(name).needs_draft else {}
    with simulated():
        waits, tokens = waits_per_forward(target, name, rows=3, **params, **draft)
    assert tokens == base and waits <= 1.0
