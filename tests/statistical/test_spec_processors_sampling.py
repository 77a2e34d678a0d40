"""Sampled speculative decoding with history-dependent processors (repetition penalty) and min-p reproduces
ar.sample's distribution: chi-square tests of the first two emitted tokens against exact marginals computed
with the plain processor functions, for a model drafter, a deterministic chain drafter and a tree drafter.

The second token is where per-position history matters: after an accepted drafted x_1 the target's p at the
next position must penalise x_1, exactly as ar.sample does after emitting it. The tiny random model seldom
repeats a token, so these tests run on a "repeater": its output head also scores each token by its similarity to
the current input token, so without the penalty a third of second tokens would repeat the first."""

from __future__ import annotations

import pytest
import torch
from sampling_stats import N, chi_square_p_value, first_two

import fastdecode
from fastdecode import sampling
from fastdecode.engine import encode_batch
from fastdecode.registry import RunContext
from fastdecode.speculative.drafter import BaseDrafter, Draft, SpecConfig
from fastdecode.speculative.driver import speculative
from fastdecode.speculative.tree import depths

PROCESSORS = dict(temperature=1.0, top_k=16, min_p=0.02, repetition_penalty=3.0)


def processed(model, ids: torch.Tensor, history: bool = True) -> torch.Tensor:
    """`[B, L]` prompts (same length) -> `[B, V]` next-token distributions under PROCESSORS, the seen tokens being
    all of `ids` (or, with history=False, only the first L - 1 of them: a verifier that forgets drafted tokens).
    Computed on the model's device, returned on the CPU, where the draws are counted."""
    ids = ids.to(model.device)
    L = ids.shape[1]
    logits = model.forward(ids, torch.arange(L, device=ids.device).expand_as(ids))[:, -1]
    seen_ids = ids if history else ids[:, :-1]
    seen = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, seen_ids, True)
    x = sampling.repetition_penalty(logits, seen, PROCESSORS["repetition_penalty"])
    x = sampling.top_k(sampling.temperature(x, PROCESSORS["temperature"]), PROCESSORS["top_k"])
    return sampling.min_p(x, PROCESSORS["min_p"]).float().softmax(-1).cpu()


def second_marginal(model, prompt, p1, history: bool = True) -> torch.Tensor:
    support = [x for x in p1.nonzero().squeeze(-1).tolist() if x not in model.eos_token_ids]
    ids = torch.cat([torch.tensor([prompt]).expand(len(support), -1), torch.tensor(support)[:, None]], 1)
    weights = p1[support] / p1[support].sum()
    return (weights[:, None] * processed(model, ids, history)).sum(0)


def repeater(causal_dir, noise: float = 0.0):
    model = fastdecode.load(causal_dir)
    with torch.no_grad():
        for layer in model.model.model.layers:  # weaker layers: the head sees mostly the input token's embedding
            layer.mlp.down_proj.weight.mul_(0.3)
            layer.self_attn.o_proj.weight.mul_(0.3)
        head = model.model.lm_head.weight
        head.add_(4.0 * model.model.model.embed_tokens.weight)
        if noise:
            head.add_(noise * torch.randn(head.shape, generator=torch.Generator().manual_seed(0)).to(head.device))
    return model


@pytest.fixture(scope="module")
def target(causal_dir):
    return repeater(causal_dir)


@pytest.fixture(scope="module")
def near_target(causal_dir):
    return repeater(causal_dir, noise=0.1)


@pytest.fixture(scope="module")
def exact(target, prompt):
    p1 = processed(target, torch.tensor([prompt]))[0]
    return p1, second_marginal(target, prompt, p1)


def test_the_test_has_power(target, prompt, exact):
    """Forgetting the first token in the second position's history must be detected by the same test."""
    p1, p2 = exact
    wrong = second_marginal(target, prompt, p1, history=False)
    draws = torch.multinomial(wrong, N, replacement=True, generator=torch.Generator().manual_seed(0)).tolist()
    assert 0.5 * (wrong - p2).abs().sum() > 0.2
    try:
        assert chi_square_p_value(draws, p2) < 1e-3
    except AssertionError as e:  # or it drew tokens the right law gives probability 0 (top-k, min-p)
        assert "probability 0" in str(e)


def test_ar_sample_matches_the_marginals(target, prompt, exact):
    results = fastdecode.generate(target, [prompt] * N, "ar.sample", seed=10, max_new_tokens=2, **PROCESSORS)
    first, second = first_two([r.token_ids for r in results])
    assert chi_square_p_value(first, exact[0]) > 1e-3
    assert chi_square_p_value(second, exact[1]) > 1e-3


def run_driver(target, prompt, cfg, drafter):
    batch = encode_batch(target, [prompt] * N, cfg.max_new_tokens)
    rows: list[dict[int, int]] = [{} for _ in range(N)]
    accepted = 0
    for event in speculative(target, batch, cfg, RunContext(), drafter):
        accepted += sum(event.accepted)
        for b, pairs in enumerate(event.tokens):
            rows[b].update(pairs)
    return accepted, first_two([[row[i] for i in sorted(row)] for row in rows])


def test_model_drafter_matches_the_marginals(target, near_target, prompt, exact):
    results = fastdecode.generate(target, [prompt] * N, "spec.draft_model", draft=near_target, seed=11,
                                  max_new_tokens=2, num_draft_tokens=2, **PROCESSORS)
    accepted = sum(r.stats.accepted for r in results)
    assert 0.1 * N < accepted < 0.9 * N
    first, second = first_two([r.token_ids for r in results])
    assert chi_square_p_value(first, exact[0]) > 1e-3
    assert chi_square_p_value(second, exact[1]) > 1e-3


class Fixed(BaseDrafter):
    """Always proposes the same chain."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        return Draft(torch.tensor(self.tokens[:k], dtype=torch.long))


def test_deterministic_drafter_matches_the_marginals(target, prompt, exact):
    """The likeliest first token a, twice: the second a is likely under p without the drafted history (a repeater
    repeats) and has probability ~0 with it, so only a verifier that penalises the drafted a at position 2 passes."""
    a = int(exact[0].argmax())
    cfg = SpecConfig(max_new_tokens=2, seed=12, **PROCESSORS)
    accepted, (first, second) = run_driver(target, prompt, cfg, lambda generator: Fixed([a, a]))
    assert accepted > 0.05 * N
    assert chi_square_p_value(first, exact[0]) > 1e-3
    assert chi_square_p_value(second, exact[1]) > 1e-3


class FixedTree(BaseDrafter):
    """Always proposes the same tree."""

    def __init__(self, tokens: list[int], parents: list[int]) -> None:
        self.tokens, self.parents = tokens, parents

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        keep = [i for i, d in enumerate(depths(self.parents)) if d <= k]  # parents come first, so indices stay
        return Draft(torch.tensor([self.tokens[i] for i in keep]), parents=[self.parents[i] for i in keep])


def test_tree_drafter_matches_the_marginals(target, prompt, exact):
    """The two likeliest first tokens a, b, each followed by itself and by the other: a node's history is its
    path, so the repeat is penalised and the cross child is not."""
    a, b = exact[0].topk(2).indices.tolist()
    tree = FixedTree([a, b, a, b, b, a], parents=[-1, -1, 0, 0, 1, 1])
    cfg = SpecConfig(max_new_tokens=3, seed=13, **PROCESSORS)
    accepted, (first, second) = run_driver(target, prompt, cfg, lambda generator: tree)
    assert accepted > 0.1 * N
    assert chi_square_p_value(first, exact[0]) > 1e-3
    assert chi_square_p_value(second, exact[1]) > 1e-3
