"""EAGLE-2's best-first tree as tensors (`speculative/best_first.py`): the beam and the kept nodes follow the score with
ties to the node made first (a stable sort), a token the draft cannot propose (-inf) is never kept, and each fed node
sees exactly its ancestors and itself."""

from __future__ import annotations

import torch

from fastdecode.speculative.best_first import BestFirst
from fastdecode.speculative.tree import DeviceTree, ancestor_mask, check_tree

V = 8


def logits_of(rows: list[list[float]]) -> torch.Tensor:
    """Logits whose log-softmax gives the rows' log-probabilities (rows of probabilities, zeros to -inf)."""
    return torch.tensor(rows).log()


def test_ties_go_to_the_node_made_first_and_impossible_tokens_are_dropped():
    nodes = BestFirst(width=3, total=5, device=torch.device("cpu"))
    # the root: tokens 2 and 5 tie, 7 is less likely, every other token impossible (a reduced draft vocabulary)
    nodes.add_children(logits_of([[0, 0, 0.4, 0, 0, 0.4, 0, 0.2]]))
    beam = nodes.beam()
    assert beam.tokens.tolist() == [2, 5, 7]  # ties: topk's order, then the stable sort keeps it
    # node 0 (token 2) gets one sure child; node 1 (token 5) two halves; node 2 (token 7) an impossible row but one
    rows = [[1, 0, 0, 0, 0, 0, 0, 0], [0, 0.5, 0, 0.5, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 1, 0]]
    nodes.add_children(logits_of(rows), beam)
    tokens, parents = nodes.best()
    check_tree(tokens, parents)
    # scores: 2 (0.4), 5 (0.4), 7 (0.2), 2>0 (0.4), 5>1 (0.2), 5>3 (0.2), 7>6 (0.2); -inf nodes never kept
    assert list(zip(tokens, parents, strict=True)) == [(2, -1), (5, -1), (7, -1), (0, 0), (1, 1)]
    nodes.total = 20  # more than the 7 possible nodes (of 12 made): the impossible ones are still left out
    tokens, parents = nodes.best()
    check_tree(tokens, parents)
    assert list(zip(tokens, parents, strict=True)) == [(2, -1), (5, -1), (7, -1), (0, 0), (1, 1), (3, 1), (6, 2)]


def test_the_tree_left_unread_is_the_tree_read_with_its_impossible_nodes_last():
    """`kept` (a device's tree: nothing read, its size known on the host) equals `best` where every kept node is
    possible; where fewer than `total` are, it keeps impossible ones too, after the possible ones in rank."""
    nodes = BestFirst(width=3, total=5, device=torch.device("cpu"))
    nodes.add_children(logits_of([[0, 0, 0.4, 0, 0, 0.4, 0, 0.2]]))
    beam = nodes.beam()
    rows = [[1, 0, 0, 0, 0, 0, 0, 0], [0, 0.5, 0, 0.5, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 1, 0]]
    nodes.add_children(logits_of(rows), beam)
    tokens, parents = nodes.best()
    ids, tree = nodes.kept()
    assert isinstance(tree, DeviceTree) and tree.depth == 2 and tree.order is None
    assert ids.tolist() == tokens and tree.parents.tolist() == parents
    nodes.total = 20  # 12 made, 7 possible: all 12 kept, in creation order, each after its parent
    ids, tree = nodes.kept()
    check_tree(ids.tolist()[:3], tree.parents.tolist()[:3])
    assert len(tree) == 12 and all(-1 <= p < i for i, p in enumerate(tree.parents.tolist()))
    possible = [i for i, s in enumerate(nodes.scores.tolist()) if s > float("-inf")]
    assert [ids.tolist()[i] for i in possible] == nodes.best()[0]


def test_a_fed_node_sees_its_ancestors_and_itself():
    g = torch.Generator().manual_seed(0)
    nodes = BestFirst(width=2, total=20, device=torch.device("cpu"))
    nodes.add_children(torch.randn(1, V, generator=g))
    fed = []
    for _ in range(3):
        beam = nodes.beam()
        fed += beam.nodes.tolist()
        line = ancestor_mask(nodes.parents.tolist())  # [N, N] node i sees node j
        assert torch.equal(beam.sees, line[beam.nodes][:, fed])
        nodes.add_children(torch.randn(beam.nodes.numel(), V, generator=g), beam)
    paths = nodes.paths(beam, 3).tolist()
    for node, path in zip(beam.nodes.tolist(), paths, strict=True):
        walk = []
        while node >= 0:
            walk.append(int(nodes.tokens[node]))
            node = int(nodes.parents[node])
        assert path == walk[::-1]
