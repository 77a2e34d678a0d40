"""Recursive Speculative Decoding on hand-built distributions: Gumbel-top-k draws without replacement, and
`verify_tree_rsd` reproduces the target's marginals for trees sampled that way; config checks of spec.rsd and
spec.dyntree."""

from __future__ import annotations

import itertools

import pytest
import torch

from fastdecode.errors import ParameterError
from fastdecode.speculative.drafters.dyntree import DynTreeConfig
from fastdecode.speculative.drafters.rsd import RSDConfig, gumbel_top_k, parse_branches
from fastdecode.speculative.tree import verify_tree_rsd

V = 6


def normalised(x: torch.Tensor) -> torch.Tensor:
    return x / x.sum(-1, keepdim=True)


def drawn(q: torch.Tensor, k: int, g: torch.Generator) -> list[list[int]]:
    """Each row's drawn tokens, in drawing order."""
    ids, ok = gumbel_top_k(q, k, g)
    return [[x for x, y in zip(i, o, strict=True) if y] for i, o in zip(ids.tolist(), ok.tolist(), strict=True)]


def test_gumbel_top_k_draws_without_replacement_in_sampling_order():
    q = torch.tensor([[0.5, 0.3, 0.15, 0.05, 0.0, 0.0]])
    g = torch.Generator().manual_seed(0)
    n = 20000
    counts: dict[tuple[int, int], int] = {}
    for _ in range(n):
        first, second = drawn(q, 2, g)[0]
        counts[first, second] = counts.get((first, second), 0) + 1
    for a, b in itertools.permutations(range(4), 2):
        exact = float(q[0, a] * q[0, b] / (1 - q[0, a]))  # q(a) then q(b) renormalised without a
        assert counts.get((a, b), 0) / n == pytest.approx(exact, abs=0.012)
    assert sum(counts.values()) == n  # never a repeated token, never a token of probability 0


def test_gumbel_top_k_stops_at_the_support():
    q = torch.tensor([[0.0, 0.7, 0.0, 0.3, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    picks = drawn(q, 4, torch.Generator().manual_seed(1))
    assert sorted(picks[0]) == [1, 3] and picks[1] == [0]
    ids, ok = gumbel_top_k(q, 4, torch.Generator().manual_seed(1))
    assert ids.shape == ok.shape == (2, 4) and ok.tolist() == [[True, True, False, False], [True, False, False, False]]
    assert (q.gather(1, ids) > 0).equal(ok)  # the undrawn places hold tokens of probability 0


# A depth-2 problem: the target p and draft q at the root, and after each first token x the tables P2[x], Q2[x].
GEN = torch.Generator().manual_seed(5)
P1 = normalised(torch.rand(V, generator=GEN) ** 2)
Q1 = normalised(torch.rand(V, generator=GEN) ** 2)  # far from P1: rejections and residual draws are common
P2 = normalised(torch.rand(V, V, generator=GEN) ** 2)
Q2 = normalised(torch.rand(V, V, generator=GEN) ** 2)
P3 = torch.full((V,), 1.0 / V)  # after a depth-2 node (bonus row): any law will do


def sampled_tree(g: torch.Generator, b1: int = 3, b2: int = 2):
    """Draw a tree as spec.rsd does: b1 root children from Q1 without replacement, b2 under each from Q2[x].

    Returns tokens, parents, p `[T + 1, V]` (root row first) and q `[T, V]` (the law each node was drawn from)."""
    nodes = [(x, -1, Q1, P2[x]) for x in drawn(Q1[None], b1, g)[0]]  # (token, parent, q row, p row)
    for i in range(len(nodes)):
        x = nodes[i][0]
        nodes += [(y, i, Q2[x], P3) for y in drawn(Q2[x][None], b2, g)[0]]
    tokens, parents, q_rows, p_rows = zip(*nodes, strict=True)
    return list(tokens), list(parents), torch.stack([P1, *p_rows]), torch.stack(q_rows)


def run_many(verify, n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    firsts, pairs, accepted = [], [], [0, 0, 0]
    for _ in range(n):
        tokens, parents, p, q = sampled_tree(g)
        v = verify(tokens, parents, p, q, g)
        accepted[v.accepted] += 1
        firsts.append(v.tokens[0])
        if v.accepted >= 1:
            pairs.append((v.tokens[0], v.tokens[1]))  # given an accepted first token x, the next follows P2[x]
    return firsts, pairs, accepted


def p_value(tokens: list[int], p: torch.Tensor) -> float:
    """Pearson's chi-square test of the draws against `[V]` probabilities; cells expecting < 5 draws are pooled."""
    observed = torch.bincount(torch.tensor(tokens), minlength=V).double()
    expected = len(tokens) * p.double()
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2))


def test_rsd_verification_reproduces_the_target_marginals():
    n = 12000
    firsts, pairs, accepted = run_many(verify_tree_rsd, n, seed=0)
    assert min(accepted) > 0.05 * n  # rejections at the root, at depth 2, and full acceptance all occur
    assert p_value(firsts, P1) > 1e-3
    tested = 0
    for x in range(V):
        after = [y for a, y in pairs if a == x]
        if len(after) >= 400:
            assert p_value(after, P2[x]) > 1e-3
            tested += 1
    assert tested >= 2


def test_the_marginal_check_has_power():
    """Verifying with a q other than the one the siblings were drawn from is biased, and the check sees it."""
    uniform = torch.full((V,), 1.0 / V)
    wrong_q = lambda tokens, parents, p, q, g: verify_tree_rsd(tokens, parents, p, uniform.expand_as(q), g)  # noqa: E731
    firsts, _, _ = run_many(wrong_q, 6000, seed=1)
    assert p_value(firsts, P1) < 1e-3


def test_rsd_renormalises_q_without_the_rejected_siblings():
    # p puts everything on token 2; q on tokens 0 and 1 (and a little on 2). After 0 and 1 are rejected, q
    # without them is one-hot on 2, which p then accepts with certainty: the third sibling always wins.
    p = torch.zeros(4, V)
    p[0, 2] = 1.0
    p[1:, 0] = 1.0
    q = torch.tensor([0.6, 0.3, 0.1, 0.0, 0.0, 0.0]).expand(3, V)
    g = torch.Generator().manual_seed(2)
    for _ in range(50):
        v = verify_tree_rsd([0, 1, 2], [-1, -1, -1], p, q, g)
        assert v.accepted == 1 and v.tokens == [2, 0]


def test_rsd_accepts_certain_paths_and_draws_the_residual_when_all_fail():
    p = torch.zeros(4, V)
    p[0, 4] = 1.0  # the target wants 4 at the root; the root children are 0 and 1
    p[1:, 5] = 1.0
    q = torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0, 0.0]).expand(3, V)
    v = verify_tree_rsd([0, 1, 3], [-1, -1, 0], p, q, torch.Generator().manual_seed(3))
    assert v.accepted == 0 and v.tokens == [4]
    p[0] = q[0]  # now p = q at the root: its first child is accepted with probability 1
    p[1] = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0, 0.0])  # after 0 the target wants 3, drawn from a one-hot q
    q2 = q.clone()
    q2[2] = p[1]
    for seed in range(20):
        v = verify_tree_rsd([0, 1, 3], [-1, -1, 0], p, q2, torch.Generator().manual_seed(seed))
        assert v.accepted == 2 and v.tokens == [0, 3, 5]  # 0 -> 3 -> the bonus from the leaf's row


def test_rsd_passes_over_a_candidate_its_q_cannot_draw():
    """A row of q with fewer tokens of positive probability than the branching factor leaves its last children void
    (`gumbel_top_k`): the walk never accepts one, and the law stays p's."""
    p = torch.full((3, V), 1.0 / V)
    q = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 0.0]).expand(2, V)  # after token 0, q without it has nothing left
    g = torch.Generator().manual_seed(0)
    firsts = []
    for _ in range(3000):
        v = verify_tree_rsd([0, 1], [-1, -1], p, q, g)
        assert v.nodes in ((), (0,))  # node 1 (token 1, which q cannot draw) is never accepted
        firsts.append(v.tokens[0])
    assert p_value(firsts, p[0]) > 1e-3


def test_bad_parameters_are_refused():
    assert parse_branches("3,2,1") == [3, 2, 1]
    for bad in ["", "0", "2,0,1", "2,x", "-1", "2,,1"]:
        with pytest.raises(ParameterError, match="branches"):
            RSDConfig(branches=bad)
    with pytest.raises(ParameterError, match="at most 512"):
        RSDConfig(branches="8,8,8,8")
    for kw in [dict(total_tokens=0), dict(total_tokens=10_000), dict(depth=0), dict(width=0)]:
        with pytest.raises(ParameterError, match=next(iter(kw))):
            DynTreeConfig(**kw)
    with pytest.raises(ParameterError, match="temperature"):
        RSDConfig(temperature=-1.0)
