"""Every method registered `lossless=True` reproduces its kind's baseline token for token, found through the
registry: a new lossless method is checked the day it is registered, with its default parameters, on the tiny
fp32 models (a batch of prompts; a different random model, or the tiny diffusion model, where it needs a draft).
The method-specific files test parameters, trees, EOS and length cuts, and sampling on top of this."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

import fastdecode
from fastdecode.bench.harness import BASELINES
from fastdecode.registry import list_methods
from fastdecode.speculative.memory import DrafterMemory

PROMPTS = ["the quick brown fox", "def add(a, b):", "Sort this", "0123456789 ABC abc the lazy dog jumps"]
NEW_TOKENS = {"causal": 40, "diffusion": 16}
LOSSLESS = [m.name for m in list_methods() if m.lossless and m.name not in BASELINES.values()]


@pytest.fixture(scope="module")
def models(causal, diffusion, to_device):
    """The target of each kind, and a draft of each kind that shares the tokenizer: for causal drafts a different
    random model with the target's shape (it disagrees with the target often), for diffusion drafts the tiny MDLM."""
    with torch.random.fork_rng():
        torch.manual_seed(1)
        twin = LlamaForCausalLM(causal.model.config).eval()
    with torch.no_grad():
        twin.lm_head.weight.mul_(8.0)  # as sharp as the target (conftest.save_causal)
    other = fastdecode.CausalLM(to_device(twin), causal.tokenizer, name="tiny-draft")
    return {"causal": causal, "diffusion": diffusion}, {"causal": other, "diffusion": diffusion}


def test_every_kind_of_lossless_method_has_a_baseline():
    assert LOSSLESS and {m.kind for m in list_methods() if m.lossless} <= set(BASELINES)
    assert all(fastdecode.get_method(b).lossless for b in BASELINES.values())


@pytest.mark.parametrize("name", LOSSLESS)
def test_lossless_method_equals_its_baseline(models, name):
    targets, drafts = models
    method = fastdecode.get_method(name)
    model, n = targets[method.kind], NEW_TOKENS[method.kind]
    base = fastdecode.generate(model, PROMPTS, BASELINES[method.kind], max_new_tokens=n)
    draft = {"draft": drafts[method.draft_kind]} if method.needs_draft else {}
    out = fastdecode.generate(model, PROMPTS, name, max_new_tokens=n, memory=DrafterMemory(), **draft)
    assert [r.token_ids for r in out] == [r.token_ids for r in base]
    for r, b in zip(out, base, strict=True):
        s = r.stats
        assert s.new_tokens == len(r.token_ids) and s.finish_reason == b.stats.finish_reason
        assert s.accepted <= s.proposed and sum(s.accepted_per_position) == s.accepted
        if method.kind == "causal":
            assert s.forwards <= s.new_tokens  # every target forward emits at least one token
