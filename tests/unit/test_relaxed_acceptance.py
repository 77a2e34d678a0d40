"""The relaxed acceptance rules of spec.lantern and spec.gsd (speculative/relaxed.py) on hand-made distributions:
with no relaxation they are speculative sampling draw for draw; LANTERN's target stays within delta of p."""

from __future__ import annotations

import pytest
import torch

from fastdecode.speculative.relaxed import (
    code_distances,
    gsd_group,
    lantern_target,
    neighbour_order,
    verify_gsd,
    verify_lantern,
)
from fastdecode.speculative.verify import verify_sampling

K, V = 8, 11  # 8 codes on a line, then 3 ids that are never generated
CODEBOOK = torch.linspace(0, 1, K)[:, None]  # [K, 1]


def _case(seed: int, k: int = 4, one_hot: bool = False):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(k + 1, V, generator=g) ** 3
    p[:, K:] = 0
    p /= p.sum(-1, keepdim=True)  # [k + 1, V]
    q = torch.rand(k, V, generator=g)
    q[:, K:] = 0
    q /= q.sum(-1, keepdim=True)  # [k, V]
    draft = torch.multinomial(q, 1, generator=g).squeeze(1)  # [k]
    return draft, (None if one_hot else q), p


@pytest.mark.parametrize("one_hot", [False, True])
def test_no_relaxation_gives_speculative_sampling_verdicts(one_hot):
    near = neighbour_order(CODEBOOK)
    dist = code_distances(CODEBOOK)
    for seed in range(40):
        draft, q, p = _case(seed, one_hot=one_hot)
        want = verify_sampling(draft, q, p, torch.Generator().manual_seed(seed))
        lantern = verify_lantern(draft, q, p, torch.Generator().manual_seed(seed), neighbours=near[:, :3], delta=0.0)
        gsd = verify_gsd(draft, q, p, torch.Generator().manual_seed(seed), ranks=0, prob_gap=1.0, max_dist=9.0,
                         distances=dist)
        assert lantern == want and gsd == want
    # what a drafter asks of the logits comes back with the verdict, as with verify_sampling, no draw changed
    draft, q, p = _case(0, one_hot=one_hot)
    asked = torch.tensor([4, 2])
    want = verify_sampling(draft, q, p, torch.Generator().manual_seed(0), asked)
    got = verify_lantern(draft, q, p, torch.Generator().manual_seed(0), asked, neighbours=near[:, :3], delta=0.0)
    assert (got.accepted, got.tokens) == (want.accepted, want.tokens) and torch.equal(got.read, asked)


def test_neighbours_are_nearest_first_without_the_code_itself():
    near = neighbour_order(CODEBOOK)
    assert near.shape == (K, K - 1)
    assert near[0, :3].tolist() == [1, 2, 3] and near[4, :2].tolist() == [3, 5]
    assert not (near == torch.arange(K)[:, None]).any()


def test_lantern_moves_at_most_delta_onto_the_draft():
    p = torch.tensor([0.05, 0.3, 0.05, 0.1, 0.2, 0.1, 0.1, 0.1, 0, 0, 0])
    near = neighbour_order(CODEBOOK)[:, :4]
    relaxed = lantern_target(p, 2, near, 0.2)  # nearest of 2: 1 (0.3) exceeds 0.2 at once -> nothing moves
    assert torch.equal(relaxed, p)
    relaxed = lantern_target(p, 7, near, 0.15)  # nearest of 7: 6 (0.1), 5 (0.1): only 6 fits
    assert relaxed[7] == pytest.approx(0.2) and relaxed[6] == 0 and relaxed.sum() == pytest.approx(1.0)
    assert (relaxed - p).abs().sum() / 2 <= 0.15 + 1e-6


def test_relaxation_raises_acceptance():
    near, dist = neighbour_order(CODEBOOK), code_distances(CODEBOOK)
    exact = lantern = gsd = 0
    for seed in range(300):
        draft, q, p = _case(seed, k=1)
        exact += verify_sampling(draft, q, p, torch.Generator().manual_seed(seed)).accepted
        lantern += verify_lantern(draft, q, p, torch.Generator().manual_seed(seed), neighbours=near[:, :4],
                                  delta=0.3).accepted
        gsd += verify_gsd(draft, q, p, torch.Generator().manual_seed(seed), ranks=3, prob_gap=0.3, max_dist=0.5,
                          distances=dist).accepted
    assert lantern > exact and gsd > exact


def test_gsd_group_keeps_the_draft_and_filters_by_probability_and_distance():
    p = torch.tensor([0.3, 0.25, 0.2, 0.1, 0.05, 0.05, 0.03, 0.02, 0, 0, 0])
    dist = code_distances(CODEBOOK)
    group = gsd_group(p, 1, 2, 0.1, 0.2, dist)  # ranks 0..3 -> codes 0, 1, 2, 3; |dp| < .1 -> 0, 1, 2; close -> all
    assert sorted(group.tolist()) == [0, 1, 2]
    assert gsd_group(p, 1, 2, 0.1, 0.1, dist).tolist() == [1]  # neighbours 1/7 apart are too far
    assert gsd_group(p, 9, 2, 1.0, 9.0, dist).tolist() == [9]  # a non-code id stands alone


def test_the_batched_group_is_each_row_s_group():
    from fastdecode.speculative.relaxed import group_mask

    dist = code_distances(CODEBOOK)
    for seed in range(20):
        draft, _, p = _case(seed, k=5)
        for ranks, gap, far in [(1, 0.2, 0.3), (3, 0.5, 0.6), (9, 1.0, 9.0), (2, 0.0, 0.0)]:
            mask = group_mask(p[:5], draft, ranks, gap, far, dist)
            for i in range(5):
                want = sorted(gsd_group(p[i], int(draft[i]), ranks, gap, far, dist).tolist())
                assert mask[i].nonzero().squeeze(-1).tolist() == want


def test_the_batched_lantern_target_is_each_row_s():
    from fastdecode.speculative.relaxed import lantern_targets

    near = neighbour_order(CODEBOOK)
    for seed in range(20):
        draft, _, p = _case(seed, k=5)
        draft[0] = 9  # a non-code id keeps p
        for n, delta in [(0, 0.3), (2, 0.1), (4, 0.3), (7, 1.0)]:
            got = lantern_targets(p[:5], draft, near[:, :n], delta)
            for i in range(5):
                assert torch.equal(got[i], lantern_target(p[i], int(draft[i]), near[:, :n], delta))
