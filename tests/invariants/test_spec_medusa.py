"""spec.medusa equals ar.greedy token for token with Medusa and Hydra heads, trees of every size and a chain; the
tree it drafts stays within its node budget, closed under parents, siblings distinct; without a head for a model it
is refused unless untrained heads are allowed (the test suite allows them)."""

from __future__ import annotations

import pytest
import torch

import fastdecode
from fastdecode.errors import ModelLoadError
from fastdecode.heads.medusa import MedusaHead
from fastdecode.speculative.drafters.medusa import MedusaDrafter, MedusaSpecConfig
from fastdecode.speculative.tree import check_tree, depths

PROMPTS = ["the quick brown fox", "def add(a, b):", "Sort this", "0123456789 ABC"]


@pytest.mark.parametrize("params", [
    {}, {"hydra": True}, {"total_tokens": 1}, {"width": 1, "total_tokens": 4}, {"depth": 2, "width": 6},
    {"hydra": True, "total_tokens": 40, "width": 8},
])
def test_greedy_equals_ar_greedy(causal, params):
    base = fastdecode.generate(causal, PROMPTS, "ar.greedy", max_new_tokens=30)
    got = fastdecode.generate(causal, PROMPTS, "spec.medusa", max_new_tokens=30, **params)
    assert [r.token_ids for r in got] == [r.token_ids for r in base]
    assert sum(r.stats.proposed for r in got) > 0


def test_sampling_runs_and_repeats_with_its_seed(causal):
    a = fastdecode.generate(causal, PROMPTS, "spec.medusa", max_new_tokens=20, temperature=0.8, seed=3)
    b = fastdecode.generate(causal, PROMPTS, "spec.medusa", max_new_tokens=20, temperature=0.8, seed=3)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]


@pytest.mark.parametrize("total, width", [(16, 4), (5, 3), (64, 10)])
def test_the_tree_is_within_budget_and_well_formed(causal, to_device, total, width):
    cfg = MedusaSpecConfig(total_tokens=total, width=width)
    head = to_device(MedusaHead.untrained(causal))
    drafter = MedusaDrafter(causal, head, cfg)
    assert drafter.propose(torch.tensor([5, 6]), 8).tokens.numel() == 0  # no hidden state yet: nothing to draft
    drafter.hidden = torch.randn(causal.config.hidden_size).to(causal.device)  # [H] where the target's would be
    draft = drafter.propose(torch.tensor([5, 6]), 8)  # 4 levels: w nodes, then w² each
    assert draft.parents is not None and draft.tokens.numel() == min(total, width + 3 * width**2)
    check_tree(draft.tokens.tolist(), draft.parents)
    assert max(depths(draft.parents)) <= head.config.num_heads
    assert drafter.propose(torch.tensor([5, 6]), 2).depth <= 2  # never deeper than the room asked


def test_the_next_state_is_the_last_accepted_nodes(causal):
    """`observe` keeps the target's hidden state of the node ending the accepted path (`Verification.nodes`, the
    driver's, in the drafter's order), the root's when nothing was accepted."""
    from fastdecode.speculative.drafter import Verification

    drafter = MedusaDrafter(causal, MedusaHead.untrained(causal), MedusaSpecConfig())
    hidden = torch.arange(6.0)[:, None].expand(6, 4)  # P = 1: the root's row, then nodes 0..4
    logits = torch.zeros(6, 3)
    drafter.observe(Verification(2, (8, 7, 1), logits, 5, hidden, nodes=(1, 3)))
    assert drafter.hidden is not None and drafter.hidden[0] == 4.0  # node 3's row
    drafter.observe(Verification(0, (1,), logits, 5, hidden, nodes=()))
    assert drafter.hidden[0] == 0.0  # the root's
    drafter.observe(Verification(2, (8, 7, 1), logits[:3], 2, hidden[:3]))  # a chain: its first 2 nodes
    assert drafter.hidden[0] == 2.0


def test_a_model_without_a_head_is_refused_unless_untrained_heads_are_allowed(causal, monkeypatch):
    monkeypatch.delenv("FASTDECODE_UNTRAINED_HEADS")
    with pytest.raises(ModelLoadError, match="train drafter --target MODEL --kind medusa"):
        fastdecode.generate(causal, "the", "spec.medusa", max_new_tokens=4)
    with pytest.raises(ModelLoadError, match="kind hydra"):
        fastdecode.generate(causal, "the", "spec.medusa", max_new_tokens=4, hydra=True)


@pytest.mark.parametrize("ahead", [True, False])
def test_heads_run_ahead_or_after_the_verdict_alike(causal, monkeypatch, ahead):
    """`MedusaDrafter.ahead`: the heads' candidates of every verified row, read with the verdict (a device's
    default), or the accepted node's, read after it (the CPU's): the target's tokens either way, greedy and seeded."""
    monkeypatch.setattr(MedusaDrafter, "ahead", ahead)
    base = fastdecode.generate(causal, PROMPTS, "ar.greedy", max_new_tokens=30)
    got = fastdecode.generate(causal, PROMPTS, "spec.medusa", max_new_tokens=30)
    assert [r.token_ids for r in got] == [r.token_ids for r in base]
    assert sum(r.stats.accepted for r in got) > 0
    a = fastdecode.generate(causal, PROMPTS, "spec.medusa", max_new_tokens=20, temperature=0.8, seed=3)
    b = fastdecode.generate(causal, PROMPTS, "spec.medusa", max_new_tokens=20, temperature=0.8, seed=3)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
