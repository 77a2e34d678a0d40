"""spec.dlm_draft with sampling reproduces the target's distribution (chi-square tests over many seeded draws),
for a block drafted in one step and in two, with a bidirectional draft that couples the block's tokens.

`Coupled` drafts a block of two. Its last position has q = 1/2 on tokens a and b; its first position has the
target's own first-token distribution restricted to one half of its support, the half that the token after it
picks (a: half A, b: half B; a mask counts as a). In two steps the last position is committed first, so x_1
reveals x_2, which is then not distributed as its q_2 given x_1: verifying x_2 with q_2 would bias the second
token after a first token from A towards a and after one from B towards b. The drafter keeps only the prefix
committed in order (here x_1); the tests check the first two tokens, and the joint law of (half of the first
token, second token in a / b / other), with and without that rule.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sampling_stats import PROCESSORS, chi_square_p_value, first_two, next_distribution
from torch import nn

import fastdecode
from fastdecode.models.diffusion import MaskedDiffusionLM
from fastdecode.speculative.drafters import dlm_draft

MASK = 3
ROWS = 1600  # draws per test (sampling_stats.N = 800 leave the bias test short of power)


class Coupled(nn.Module):
    """Same-position logits for a canvas [context, masks], as the module docstring says."""

    def __init__(self, p1: torch.Tensor, halves: dict[int, torch.Tensor], config: SimpleNamespace) -> None:
        super().__init__()
        self.unused = nn.Parameter(torch.zeros(1))  # the adapter reads the device and dtype from a parameter
        self.config = config
        self.a, self.b = halves
        self.first = {t: torch.full_like(p1, float("-inf")).index_copy(0, h, p1[h].log()) for t, h in halves.items()}
        self.last = torch.full_like(p1, float("-inf")).index_fill(0, torch.tensor([self.a, self.b]), 0.0)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> SimpleNamespace:
        x = input_ids[0]  # [L]
        L = x.numel()
        logits = torch.zeros(L, self.last.numel())
        for i in (x == MASK).nonzero().flatten().tolist():
            after = int(x[i + 1]) if i + 1 < L else None
            logits[i] = self.last if after is None else self.first[self.b if after == self.b else self.a]
        return SimpleNamespace(logits=logits[None].to(input_ids.device))  # built on the CPU, used on the canvas's


@pytest.fixture(scope="module")
def halves(causal, marginals):
    """{a: half A, b: half B} of the first token's support (alternate ranks: similar mass)."""
    p1, p2 = marginals
    a, b = [t for t in p2.argsort(descending=True).tolist() if t not in causal.eos_token_ids and t != MASK][:2]
    support = p1.nonzero().flatten()
    order = support[p1[support].argsort(descending=True)]
    return {a: order[0::2], b: order[1::2]}


@pytest.fixture(scope="module")
def coupled(causal, marginals, halves):
    c = causal.model.config
    config = SimpleNamespace(vocab_size=c.vocab_size, eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id)
    # on the target's device: the drafter draws with the run's generator, which lives there
    module = Coupled(marginals[0], halves, config).to(causal.device)
    return MaskedDiffusionLM(module, causal.tokenizer, "coupled", mask_token_id=MASK, shifted=False)


@pytest.fixture(scope="module")
def cells_law(causal, prompt, marginals, halves):
    """`[6]` exact law of (h, c): h the half of the first token (A, B), c whether the second is a, b or another
    token, given the first is not EOS. Keeping x_2 after x_1 moves mass to (A, a) and (B, b), away from (A, b),
    (B, a)."""
    p1 = marginals[0]
    rows = []
    for half in halves.values():
        xs = [x for x in half.tolist() if x not in causal.eos_token_ids]
        ids = torch.cat([torch.tensor([prompt]).expand(len(xs), -1), torch.tensor(xs)[:, None]], 1)
        rows.append((p1[xs][:, None] * next_distribution(causal, ids)).sum(0))  # [V] sum_x p1(x) p(. | x)
    law = torch.stack(rows)  # [2, V]
    a, b = halves
    cells = torch.stack([law[:, a], law[:, b], law.sum(1) - law[:, a] - law[:, b]], 1).flatten()
    return cells / cells.sum()


def sample(causal, coupled, prompt, halves, steps: int, seed: int) -> tuple[list[int], list[int], list[int]]:
    """ROWS runs of 3 tokens (a first draft of 2) -> first tokens, second tokens and (half, a / b / other) cells."""
    results = fastdecode.generate(causal, [prompt] * ROWS, "spec.dlm_draft", draft=coupled, seed=seed, max_new_tokens=3,
                                  num_draft_tokens=2, draft_steps=steps, **PROCESSORS)
    accepted = sum(r.stats.accepted for r in results)
    assert 0.3 * ROWS < accepted < 1.5 * ROWS  # acceptance and the residual path are both common
    a, b = halves
    in_b = set(halves[b].tolist())
    outs = [r.token_ids for r in results]
    first, second = first_two(outs)
    cells = [3 * (o[0] in in_b) + (0 if o[1] == a else 1 if o[1] == b else 2) for o in outs if len(o) > 1]
    return first, second, cells


@pytest.mark.parametrize("steps", [1, 2])
def test_sampling_matches_the_target(causal, coupled, prompt, marginals, halves, cells_law, steps):
    first, second, cells = sample(causal, coupled, prompt, halves, steps, seed=21 + steps)
    assert chi_square_p_value(first, marginals[0]) > 1e-3
    assert chi_square_p_value(second, marginals[1]) > 1e-3
    assert chi_square_p_value(cells, cells_law) > 1e-3


def test_keeping_tokens_committed_out_of_order_would_bias_the_output(causal, coupled, prompt, marginals, halves,
                                                                     cells_law, monkeypatch):
    """The same run keeping the whole block fails the test: the in-order prefix is what keeps sampling exact."""
    monkeypatch.setattr(dlm_draft, "in_order_prefix", lambda step_of: torch.full((1,), step_of.numel(),
                                                                                 device=step_of.device))
    first, _, cells = sample(causal, coupled, prompt, halves, 2, seed=23)
    assert chi_square_p_value(first, marginals[0]) > 1e-3  # the first token stays exact
    assert chi_square_p_value(cells, cells_law) < 1e-3
