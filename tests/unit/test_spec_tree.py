"""Token trees: masks, depths, greedy longest-path and recursive-rejection verification on hand-built logits."""

from __future__ import annotations

import pytest
import torch

from fastdecode.speculative.drafter import Verification
from fastdecode.speculative.drafters.recycling import (
    RecyclingConfig,
    RecyclingDrafter,
    new_matrix,
    template_nodes,
    tree_template,
)
from fastdecode.speculative.tree import (
    DeviceTree,
    ancestor_mask,
    branch_first,
    check_tree,
    children,
    depths,
    node_depths,
    reorder,
    tree_greedy_reading,
    verify_tree_greedy,
    verify_tree_sampling,
)

#        root
#       /    \
#     0:a     1:b
#    /   \      \
#  2:c   3:d    4:e
#   |
#  5:f
TOKENS = [10, 11, 12, 13, 14, 15]
PARENTS = [-1, -1, 0, 0, 1, 2]
V = 20


def test_depths_masks_and_children():
    assert depths(PARENTS) == [1, 1, 2, 2, 2, 3]
    mask = ancestor_mask(PARENTS)
    assert mask[5].nonzero().squeeze(-1).tolist() == [0, 2, 5]
    assert mask[4].nonzero().squeeze(-1).tolist() == [1, 4]
    assert children(PARENTS) == {-1: [0, 1], 0: [2, 3], 1: [4], 2: [5], 3: [], 4: [], 5: []}
    check_tree(TOKENS, PARENTS)
    with pytest.raises(AssertionError):
        check_tree([1, 1], [-1, -1])  # repeated siblings


def test_ancestor_masks_of_random_trees_follow_the_parent_links():
    g = torch.Generator().manual_seed(0)
    for T in (1, 2, 7, 40, 96):
        parents = [int(torch.randint(-1, i, (1,), generator=g)) for i in range(T)]  # each after its parent
        expect = torch.zeros(T, T, dtype=torch.bool)
        for i in range(T):
            node = i
            while node >= 0:  # the node, its parent, ... up to the root
                expect[i, node] = True
                node = parents[node]
        assert torch.equal(ancestor_mask(parents), expect)
    assert ancestor_mask([]).shape == (0, 0)


def test_a_device_tree_gives_the_host_trees_mask_depths_order_and_verdicts():
    """A `DeviceTree` (here on the CPU: the same tensor code a GPU runs) has the host tree's ancestor mask, depths,
    first-branch-first order and reordered parents, computed without reading it; its verdicts, greedy and sampled,
    read its parents (and order) with the argmaxes and equal the host tree's."""
    g = torch.Generator().manual_seed(1)
    for T in (1, 2, 7, 40, 96):
        parents = [int(torch.randint(-1, i, (1,), generator=g)) for i in range(T)]
        tree = DeviceTree(torch.tensor(parents), max(depths(parents)) + 2)  # (a bound: more levels change nothing)
        assert torch.equal(ancestor_mask(tree), ancestor_mask(parents))
        assert node_depths(tree).tolist() == depths(parents) == node_depths(parents).tolist()
        order = branch_first(parents)
        on_device = branch_first(tree)
        assert isinstance(on_device, torch.Tensor) and on_device.tolist() == order
        moved = tree.reordered(on_device)
        assert moved.parents.tolist() == reorder(parents, order) and moved.order is on_device
        shaped = DeviceTree.shaped(torch.tensor(parents), tree.depth)  # (as a best-first tree's graph computes them)
        assert shaped.mask is not None and shaped.first is not None
        assert torch.equal(ancestor_mask(shaped), ancestor_mask(parents)) and branch_first(shaped) is shaped.first
        assert shaped.first.tolist() == order
        assert torch.equal(ancestor_mask(shaped.reordered(shaped.first)), ancestor_mask(reorder(parents, order)))
        tokens = torch.randint(0, V, (T,), generator=g)
        logits = torch.randn(T + 1, V, generator=g)
        host = verify_tree_greedy(tokens.tolist(), parents, logits)
        read = tree_greedy_reading(tokens, tree, logits).verdict()
        assert (read.accepted, read.tokens, read.nodes) == (host.accepted, host.tokens, host.nodes)
        assert read.parents == parents and read.order is None and host.parents is None
        both = tree_greedy_reading(tokens[on_device], moved, logits).verdict()
        assert both.parents == reorder(parents, order) and both.order == order
        p = logits.softmax(-1)
        seed = int(torch.randint(0, 1000, (1,), generator=g))
        drawn = verify_tree_sampling(tokens.tolist(), parents, p, torch.Generator().manual_seed(seed))
        unread = verify_tree_sampling(tokens, tree, p, torch.Generator().manual_seed(seed))
        assert (unread.accepted, unread.tokens, unread.nodes) == (drawn.accepted, drawn.tokens, drawn.nodes)
        assert unread.parents == parents


def argmax_rows(best: list[int]) -> torch.Tensor:
    logits = torch.zeros(len(best), V)
    logits[torch.arange(len(best)), torch.tensor(best)] = 1.0
    return logits


def test_greedy_takes_the_longest_accepted_path():
    # root -> a (10) -> c (12) -> f (15) all agree; after f the target says 7
    best = [10, 12, 0, 15, 0, 0, 7]  # rows: root, a, b, c, d, e, f
    v = verify_tree_greedy(TOKENS, PARENTS, argmax_rows(best))
    assert v.accepted == 3 and v.tokens == [10, 12, 15, 7]
    assert [TOKENS[i] for i in v.nodes] == [10, 12, 15] and v.nodes[0] == 0  # the path's nodes, root to leaf
    assert verify_tree_greedy(torch.tensor(TOKENS), PARENTS, argmax_rows(best)) == v  # tokens as a tensor too


def test_greedy_prefers_the_first_of_equally_deep_paths_and_corrects_at_a_mismatch():
    best = [11, 13, 14, 0, 0, 9, 0]  # a rejected; b -> e accepted; then 9
    assert verify_tree_greedy(TOKENS, PARENTS, argmax_rows(best)).tokens == [11, 14, 9]
    best = [3, 0, 0, 0, 0, 0, 0]  # nothing matches: emit the root's argmax
    v = verify_tree_greedy(TOKENS, PARENTS, argmax_rows(best))
    assert v.accepted == 0 and v.tokens == [3]


def test_tree_sampling_reproduces_the_target_marginals():
    g = torch.Generator().manual_seed(0)
    p = torch.rand(len(TOKENS) + 1, V, generator=g) ** 3  # rows: root, then each node
    p[0, 10] += 2.0  # make the tree's root children likely, so the inner paths are exercised
    p[1, 12] += 1.0
    p = p / p.sum(-1, keepdim=True)
    n = 12000
    firsts, after_a = [], []
    for _ in range(n):
        v = verify_tree_sampling(TOKENS, PARENTS, p, g)
        firsts.append(v.tokens[0])
        if v.tokens[0] == 10:
            after_a.append(v.tokens[1])  # given a, the next token must follow p at node a (row 1)
    freq = torch.bincount(torch.tensor(firsts), minlength=V).float() / n
    torch.testing.assert_close(freq, p[0], atol=0.02, rtol=0)
    freq = torch.bincount(torch.tensor(after_a), minlength=V).float() / len(after_a)
    torch.testing.assert_close(freq, p[1], atol=0.03, rtol=0)


def test_tree_sampling_accepts_certain_paths():
    p = torch.zeros(len(TOKENS) + 1, V)
    p[0, 11] = p[2, 14] = p[5, 4] = 1.0  # root -> b -> e -> 4
    p[[1, 3, 4, 6], 0] = 1.0
    v = verify_tree_sampling(TOKENS, PARENTS, p, torch.Generator().manual_seed(1))
    assert v.accepted == 2 and v.tokens == [11, 14, 4] and v.nodes == (1, 4)
    asked = torch.tensor([3, 1, 2])  # what a drafter asked of the logits comes in the same read, no draw changed
    w = verify_tree_sampling(TOKENS, PARENTS, p, torch.Generator().manual_seed(1), asked)
    assert (w.accepted, w.tokens, w.nodes) == (v.accepted, v.tokens, v.nodes) and torch.equal(w.read, asked)


def test_recycling_template_and_tree_from_the_adjacency_matrix():
    template = tree_template([1, 1], width=2)  # depth 1: ranks 0, 1; depth 2: only rank sums <= 1
    assert template == [(-1, 0), (-1, 1), (0, 0), (0, 1), (1, 0)]
    assert len(tree_template([7, 5, 3, 2, 1, 0], 8)) == 71
    drafter = RecyclingDrafter(RecyclingConfig(top_k_candidates=2, template="1,1"), new_matrix(V, 2))
    assert drafter.propose(torch.tensor([3, 4]), 5).tokens.numel() == 0  # nothing seen yet
    logits = torch.zeros(1, V)
    logits[0, [6, 7]] = torch.tensor([2.0, 1.0])
    drafter.observe(Verification(0, (6,), logits, 0))  # the target ranked 6, 7 after token 4
    d = drafter.propose(torch.tensor([3, 4]), 5)
    assert d.tokens.tolist() == [6, 7] and d.parents == [-1, -1]
    drafter.adjacency[6] = torch.tensor([8, 9])
    d = drafter.propose(torch.tensor([3, 4]), 5)
    assert d.tokens.tolist() == [6, 7, 8, 9] and d.parents == [-1, -1, 0, 0]
    assert drafter.propose(torch.tensor([3, 4]), 1).tokens.tolist() == [6, 7]  # depth capped by the loop


def rank_paths(nodes: list[tuple[int, int]]) -> list[tuple[int, ...]]:
    paths: list[tuple[int, ...]] = []
    for parent, rank in nodes:
        paths.append((paths[parent] if parent >= 0 else ()) + (rank,))
    return paths


def test_recycling_default_is_the_authors_2_2_2_tree():
    assert RecyclingConfig().template == "2.2.2"
    paths = rank_paths(template_nodes("2.2.2", 8))
    assert len(paths) == 80 and len(set(paths)) == 80
    assert [sum(len(p) == d for p in paths) for d in range(1, 7)] == [8, 21, 25, 15, 8, 3]  # the README's levels
    assert all(p[:-1] in paths or len(p) == 1 for p in paths)  # every parent is in the tree
    for p in paths:  # siblings are the ranks 0.. of their parent's row, without gaps
        assert p[-1] == 0 or p[:-1] + (p[-1] - 1,) in paths
    assert [len(p) for p in paths] == sorted(len(p) for p in paths)  # breadth first
    # a few nodes the authors' template lists, and their neighbours it does not
    for p in [(7,), (1, 3), (7, 0), (5, 0, 0), (0, 7, 0), (0, 0, 0, 4), (3, 0, 0, 0), (0, 0, 0, 0, 2), (1, 0, 0, 0, 0),
              (0, 0, 0, 0, 0, 1), (0, 0, 0, 1, 0, 0)]:
        assert p in paths
    for p in [(1, 4), (6, 0, 0), (0, 1, 3), (4, 0, 0, 0), (0, 0, 0, 0, 3), (0, 0, 0, 0, 0, 2), (0, 0, 0, 2, 0, 0)]:
        assert p not in paths
    assert len(template_nodes("2.2.2", 2)) < 80 and all(r < 2 for _, r in template_nodes("2.2.2", 2))
    assert len(template_nodes("7,5,3,2,1,0", 8)) == 71  # ours, kept as an option


def test_a_branchless_deterministic_tree_is_verified_as_a_chain():
    import torch

    from fastdecode.speculative.drafter import Draft

    tokens = torch.tensor([4, 5, 6])
    assert Draft(tokens, parents=[-1, 0, 1]).as_chain().parents is None
    assert Draft(tokens, parents=[-1, 0, 0]).as_chain().parents == [-1, 0, 0]  # branches: still a tree
    sampled = Draft(tokens, probs=torch.full((3, 8), 1 / 8), parents=[-1, 0, 1])  # RSD's draws keep their tree
    assert sampled.as_chain() is sampled
