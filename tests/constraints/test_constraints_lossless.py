"""Constrained speculative decoding at temperature 0 equals constrained ar.greedy token for token, for every
lossless spec.* method of the registry (chains and trees; drafts cut at their first forbidden token) and the hf.*
references (the mask as a transformers logits processor), and every constrained output is valid."""

from __future__ import annotations

import pytest
import torch
from constraint_cases import CONSTRAINTS
from transformers import LlamaForCausalLM

import fastdecode
from fastdecode.registry import list_methods
from fastdecode.speculative.memory import DrafterMemory

PROMPTS = ["the quick brown fox", "def add(a, b):", "Sort this"]
SPEC = [m.name for m in list_methods("causal") if m.lossless and m.name != "ar.greedy"]  # spec.* and hf.*


@pytest.fixture(scope="module")
def drafts(causal, diffusion, to_device):
    with torch.random.fork_rng():
        torch.manual_seed(1)
        twin = LlamaForCausalLM(causal.model.config).eval()
    with torch.no_grad():
        twin.lm_head.weight.mul_(8.0)
    return {"causal": fastdecode.CausalLM(to_device(twin), causal.tokenizer, name="tiny-draft"), "diffusion": diffusion}


@pytest.fixture(scope="module")
def baselines(causal, check_valid):
    out = {}
    for kind, c in CONSTRAINTS.items():
        compiled = c.compile(causal)
        rows = fastdecode.generate(causal, PROMPTS, "ar.greedy", max_new_tokens=40, constraint=compiled)
        assert all(check_valid(causal, compiled, r.token_ids) for r in rows)
        out[kind] = [r.token_ids for r in rows]
    plain = fastdecode.generate(causal, PROMPTS, "ar.greedy", max_new_tokens=40)
    assert [r.token_ids for r in plain] != out["regex"]  # the constraint changes the output
    return out


@pytest.mark.parametrize("name", SPEC)
@pytest.mark.parametrize("kind", list(CONSTRAINTS))
def test_constrained_spec_equals_constrained_greedy(causal, drafts, baselines, check_valid, name, kind):
    method = fastdecode.get_method(name)
    draft = {"draft": drafts[method.draft_kind]} if method.needs_draft else {}
    compiled = CONSTRAINTS[kind].compile(causal)
    out = fastdecode.generate(causal, PROMPTS, name, max_new_tokens=40, memory=DrafterMemory(), constraint=compiled,
                              **draft)
    assert [r.token_ids for r in out] == baselines[kind]
    assert all(check_valid(causal, compiled, r.token_ids) for r in out)
    assert compiled.masks > 0 and compiled.calls > 0
