"""ParallelBench's closed forms (Kang et al., arXiv:2510.04767, Table 1) for the unmasking rules, driven by an
ideal model whose marginals are known exactly.

The oracle scores every masked slot with the true conditional distribution of the answer given the tokens
committed so far (uniform over the valid answers that agree with them). The answer is n single-token items.
- copy / replace-index have one answer: confidence top-k is exact at any k;
- replace-random (one item, any of n, replaced by a given word): top-k with k > 2 is always wrong;
- shuffle (any permutation): top-k with sampling at k = n is right with probability n!/n^n.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import fastdecode

MASK, EOS, PAD = 3, 1, 2
LETTERS = list(range(10, 36))
VOCAB = 64


class Oracle:
    """A `kind="diffusion"` adapter whose logits are the exact conditionals of a task's answer set."""

    kind, tokenizer, supports_cache, name = "diffusion", None, False, "oracle"
    mask_token_id, eos_token_ids, pad_token_id, vocab_size, max_positions = MASK, frozenset({EOS}), PAD, VOCAB, None
    device = torch.device("cpu")

    def __init__(self, n: int) -> None:
        self.n, self.answers = n, {}  # prompt ids -> valid answers

    def task(self, prompt: list[int], answers: list[tuple[int, ...]]) -> list[int]:
        self.answers[tuple(prompt)] = answers
        return prompt

    def forward(
        self, canvas: torch.Tensor, attention_mask: torch.Tensor, at: torch.Tensor | None = None
    ) -> torch.Tensor:
        B, L = canvas.shape
        logits = torch.zeros(B, L, VOCAB)
        for b in range(B):
            prompt = canvas[b, : L - self.n][attention_mask[b, : L - self.n].bool()].tolist()
            gen = canvas[b, L - self.n :].tolist()
            fits = [a for a in self.answers[tuple(prompt)] if all(g in (MASK, t) for g, t in zip(gen, a, strict=True))]
            for i, g in enumerate(gen):
                if g == MASK and fits:
                    p = torch.bincount(torch.tensor([a[i] for a in fits]), minlength=VOCAB).double() / len(fits)
                    logits[b, L - self.n + i] = p.log().float()
        return logits if at is None else logits.gather(1, at[..., None].expand(-1, -1, VOCAB))

    def accuracy(self, prompts: list[list[int]], results) -> float:
        ok = [tuple(r.token_ids) in self.answers[tuple(p)] for p, r in zip(prompts, results, strict=True)]
        return sum(ok) / len(ok)


def instances(oracle: Oracle, kind: str, count: int = 6, seed: int = 0) -> list[list[int]]:
    """`count` prompts of a task: code, the list, then the word and index where the task has them."""
    rng, n, prompts = torch.Generator().manual_seed(seed), oracle.n, []
    for c in range(count):
        pick = [LETTERS[i] for i in torch.randperm(len(LETTERS), generator=rng)[: n + 1].tolist()]
        x, w, i = pick[:n], pick[n], c % n
        if kind == "copy":
            answers = [tuple(x)]
        elif kind == "replace_index":
            answers = [tuple(w if j == i else t for j, t in enumerate(x))]
        elif kind == "replace_random":
            answers = [tuple(w if j == k else t for j, t in enumerate(x)) for k in range(n)]
        else:  # shuffle: any permutation
            answers = list(itertools.permutations(x))
        kind_id = 40 + ["copy", "replace_index", "replace_random", "shuffle"].index(kind)
        prompts.append(oracle.task([kind_id, *x, w, 36 + i], answers))
    return prompts


def top_k(oracle: Oracle, prompts, k: int, **kw):
    """LLaDA confidence top-k: k tokens per step, pure diffusion (one block)."""
    return fastdecode.generate(oracle, prompts, "dlm.baseline", max_new_tokens=oracle.n, steps=oracle.n // k, **kw)


@pytest.mark.parametrize("kind", ["copy", "replace_index"])
@pytest.mark.parametrize("n, k", [(6, 1), (6, 2), (6, 3), (6, 6), (12, 4), (12, 12)])
def test_deterministic_tasks_are_exact_at_any_k(kind, n, k):
    oracle = Oracle(n)
    prompts = instances(oracle, kind)
    results = top_k(oracle, prompts, k)
    assert oracle.accuracy(prompts, results) == 1.0
    assert all(r.stats.forwards == n // k for r in results)


@pytest.mark.parametrize("name", [m.name for m in fastdecode.methods("diffusion")])
def test_every_method_is_exact_on_copy_and_replace_index(name):
    oracle = Oracle(6)
    for kind in ("copy", "replace_index"):
        prompts = instances(oracle, kind)
        assert oracle.accuracy(prompts, fastdecode.generate(oracle, prompts, name, max_new_tokens=6)) == 1.0


@pytest.mark.parametrize("n, k", [(6, 3), (6, 6), (12, 3), (12, 4), (12, 6), (12, 12)])
def test_replace_random_fails_for_k_above_two(n, k):
    oracle = Oracle(n)
    prompts = instances(oracle, "replace_random")
    assert oracle.accuracy(prompts, top_k(oracle, prompts, k)) == 0.0


def test_replace_random_one_token_per_step_is_exact():
    oracle = Oracle(6)
    prompts = instances(oracle, "replace_random")
    assert oracle.accuracy(prompts, top_k(oracle, prompts, 1)) == 1.0


def shuffle_top_k(n: int, k: int) -> float:
    """ParallelBench: prod_i P(m_i, k) / m_i^k over the steps, m_i = n - (i-1)k the letters left."""
    return math.prod(math.perm(m, k) / m**k for m in range(n, 0, -k))


@pytest.mark.parametrize("n, k", [(3, 3), (4, 4), (4, 2)])
def test_shuffle_with_sampling_matches_the_closed_form(n, k):
    oracle = Oracle(n)
    prompt = instances(oracle, "shuffle", count=1)[0]
    rows = 800
    results = top_k(oracle, [prompt] * rows, k, temperature=1.0, seed=0)
    expected = shuffle_top_k(n, k)
    assert math.isclose(shuffle_top_k(n, n), math.factorial(n) / n**n)
    assert abs(oracle.accuracy([prompt] * rows, results) - expected) < 4 * math.sqrt(expected * (1 - expected) / rows)


def test_shuffle_argmax_at_k_equal_n_always_collides():
    oracle = Oracle(5)
    prompts = instances(oracle, "shuffle")
    assert oracle.accuracy(prompts, top_k(oracle, prompts, 5)) == 0.0


@pytest.mark.parametrize("tau, expected", [(0.6, 1.0), (0.5, 0.0)])
def test_shuffle_under_a_threshold_is_exact_iff_it_exceeds_one_half(tau, expected):
    oracle = Oracle(5)
    prompts = instances(oracle, "shuffle")
    results = fastdecode.generate(oracle, prompts, "dlm.threshold", max_new_tokens=5, threshold=tau)
    assert oracle.accuracy(prompts, results) == expected


def test_prophet_and_ete_commit_a_certain_canvas_in_one_forward():
    oracle = Oracle(8)
    prompts = instances(oracle, "copy")
    for name in ("dlm.prophet", "dlm.ete"):
        results = fastdecode.generate(oracle, prompts, name, max_new_tokens=8, block_length=2)
        assert oracle.accuracy(prompts, results) == 1.0 and all(r.stats.forwards == 1 for r in results)
    blocks = fastdecode.generate(oracle, prompts, "dlm.threshold", max_new_tokens=8, block_length=2)
    assert all(r.stats.forwards == 4 for r in blocks)  # the threshold rule never looks past its block
