"""The depth-bounded suffix tree of spec.suffix: counts, removal, frequency-scored drafts."""

from __future__ import annotations

import gc

import pytest
import torch

from fastdecode.speculative.drafters.suffix import SuffixConfig, SuffixDrafter
from fastdecode.speculative.suffix_tree import SuffixTree, best_draft, draft_from, tree_from


def path(tree: SuffixTree, tokens: list[int]) -> int:
    node = tree.root
    for t in tokens:
        node = tree.children[node][t]
    return node


def count(tree: SuffixTree, tokens: list[int]) -> int:
    return tree.count[path(tree, tokens)]


def test_counts_are_substring_occurrences():
    tree = SuffixTree(max_depth=3)
    tree.extend(0, [1, 2, 1, 2, 3])
    assert count(tree, [1]) == 2 and count(tree, [1, 2]) == 2 and count(tree, [2, 3]) == 1
    assert count(tree, [1, 2, 1]) == 1
    assert not tree.children[path(tree, [1, 2, 1])]  # depth 3 is the limit
    tree.extend(0, [1, 2])  # growing a sequence counts only the new suffixes
    assert count(tree, [1, 2]) == 3 and count(tree, [3, 1, 2]) == 1
    assert [tree.depth[n] for n in tree.suffix_nodes(0)] == [1, 2]
    assert tree.suffix_nodes(0)[1] == path(tree, [1, 2])


def test_remove_undoes_a_sequence():
    tree = SuffixTree(max_depth=4)
    tree.extend(0, [5, 6, 7])
    tree.extend(1, [6, 7, 8, 6, 7])
    tree.remove(1)
    assert len(tree) == 1 and tree.oldest() == 0
    assert count(tree, [6, 7]) == 1 and 8 not in tree.children[tree.root]
    fresh = SuffixTree(max_depth=4)
    fresh.extend(0, [5, 6, 7])

    def dump(t, node):
        return {token: (t.count[c], dump(t, c)) for token, c in t.children[node].items()}

    assert dump(tree, tree.root) == dump(fresh, fresh.root)
    assert tree.nodes == fresh.nodes  # the removed substrings' nodes are free for reuse


def test_freed_nodes_are_reused():
    tree = SuffixTree(max_depth=6)
    tree.extend(0, [1, 2, 3])
    for seq in range(1, 40):  # a global tree's FIFO: one request in, the oldest out
        tree.extend(seq, [seq % 7, 40 + seq % 5, 3, seq % 3])
        tree.remove(tree.oldest())
    assert len(tree) == 1
    fresh = SuffixTree(max_depth=6)
    fresh.extend(0, [39 % 7, 40 + 39 % 5, 3, 39 % 3])
    assert tree.nodes == fresh.nodes and len(tree.count) < 4 * fresh.nodes  # storage bounded by the live nodes


def test_a_tree_adds_no_objects_for_the_cycle_collector():
    # a node as an object was three tracked objects; ~55,000 for one generation's trees started full collections
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 300, (2000,), generator=g).tolist()
    gc.collect()
    before = len(gc.get_objects())
    tree = SuffixTree(max_depth=24)
    for t in tokens:  # one token at a time, as a generation adds them
        tree.extend(0, [t])
    gc.collect()  # (tuples of untracked items are untracked by a collection)
    assert tree.nodes > 40000  # (46,000)
    assert len(gc.get_objects()) - before < 50


def test_draft_follows_the_most_frequent_child_until_the_probability_drops():
    tree = SuffixTree(max_depth=8)
    tree.extend(0, [1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 4, 9, 1, 2])
    node = path(tree, [1, 2])  # count 4, followed by 3 twice and 4 once
    d = draft_from(tree, node, max_tokens=5, min_token_prob=0.1)
    # p = 2/4 for 3, then 1 along [9 1 2], then 1/2 at the tie between 3 and 4 (first seen wins)
    assert d.tokens == [3, 9, 1, 2, 3] and d.score == pytest.approx(0.5 * 4 + 0.25)
    assert draft_from(tree, node, max_tokens=5, min_token_prob=0.6).tokens == []
    assert draft_from(tree, node, max_tokens=1, min_token_prob=0.1).tokens == [3]


def test_tree_mode_grows_the_likeliest_continuations_first():
    tree = SuffixTree(max_depth=8)
    tree.extend(0, [1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 4, 9, 1, 2])
    node = path(tree, [1, 2])  # count 4: 3 twice (p 1/2), 4 once (p 1/4), the open end once
    d = tree_from(tree, node, max_tokens=4, min_token_prob=0.1)
    # the chain 3 9 1 2 keeps path probability 1/2 (each of its steps is certain), above the 1/4 of 4
    assert d.tokens == [3, 9, 1, 2] and d.parents == [-1, 0, 1, 2] and d.score == pytest.approx(2.0)
    d = tree_from(tree, node, max_tokens=6, min_token_prob=0.1)
    # then three candidates at 1/4: 4 under the root (offered first), then 3 and 4 after [.. 2] (offered next)
    assert d.tokens == [3, 9, 1, 2, 4, 3] and d.parents == [-1, 0, 1, 2, -1, 3]
    assert d.score == pytest.approx(2.0 + 0.25 + 0.25)
    assert tree_from(tree, node, max_tokens=6, min_token_prob=0.3).parents == [-1, 0, 1, 2]  # 1/4 under the floor
    assert tree_from(tree, node, max_tokens=6, min_token_prob=0.6).tokens == []
    assert best_draft(tree, [node], 6, 3.0, 0.0, 0.1, tree_mode=True) == d  # a 2-token match may draft 6 nodes


def test_the_drafter_sends_a_branching_tree_and_a_chain_otherwise():
    d = SuffixDrafter(SuffixConfig(max_cached_requests=0, tree=True, max_spec_factor=4.0), None)
    draft = d.propose(torch.tensor([5, 1, 7, 5, 1, 8, 5, 1]), 6)  # after [5 1]: 7 or 8, equally likely
    assert draft.parents is not None
    roots = [i for i, p in enumerate(draft.parents) if p < 0]
    assert sorted(draft.tokens[roots].tolist()) == [7, 8]
    tree_drafter = SuffixDrafter(SuffixConfig(max_cached_requests=0, tree=True), None)
    chain = tree_drafter.propose(torch.tensor([5, 6, 7, 5, 6]), 6)
    assert chain.parents == [-1, 0] and chain.tokens.tolist() == [7, 5]
    assert chain.as_chain().parents is None and chain.as_chain().tokens.tolist() == [7, 5]  # what the loop verifies
    assert draft.as_chain() is draft  # a tree with branches stays a tree


def test_draft_length_grows_with_the_match_length():
    tree = SuffixTree(max_depth=16)
    tree.extend(0, list(range(10)) * 2)
    assert [tree.depth[n] for n in tree.match([7, 8, 9])] == [1, 2]  # as Arctic: never the whole context
    nodes = tree.match([6, 7, 8, 9])  # suffixes [9], [8 9], [7 8 9]
    assert [tree.depth[n] for n in nodes] == [1, 2, 3]
    assert best_draft(tree, nodes, 100, 1.0, 0.0, 0.1).tokens == [0, 1, 2]  # at most 3 tokens for a 3-token match
    assert best_draft(tree, nodes, 2, 1.0, 0.0, 0.1).tokens == [0, 1]
    assert best_draft(tree, nodes, 100, 2.0, 1.0, 0.1).tokens == list(range(7))  # 3*2+1, clipped by the depth left
    assert tree.match([42, 9]) == [path(tree, [9])]


def test_drafter_uses_earlier_requests_through_the_global_tree():
    shared = SuffixTree(max_depth=8)
    cfg = SuffixConfig(max_cached_requests=2)
    earlier = SuffixDrafter(cfg, shared)
    earlier.propose(torch.tensor([1, 2]), 5)
    earlier.finish(torch.tensor([1, 2, 30, 31, 32, 33, 34, 35]))  # its output is 30..35
    assert len(shared) == 1
    now = SuffixDrafter(cfg, shared)
    assert now.propose(torch.tensor([7, 8, 30, 31, 32]), 5).tokens.tolist() == [33, 34, 35]  # a 3-token match drafts 3
    alone = SuffixDrafter(SuffixConfig(max_cached_requests=0), None)
    assert alone.propose(torch.tensor([7, 8, 30, 31, 32]), 5).tokens.tolist() == []
    for _ in range(3):  # FIFO eviction keeps the last max_cached_requests outputs
        d = SuffixDrafter(cfg, shared)
        d.propose(torch.tensor([0]), 1)
        d.finish(torch.tensor([0, 50, 51]))
    assert len(shared) == 2 and 30 not in shared.children[shared.root]


def test_global_trees_of_different_depths_do_not_replace_each_other():
    from fastdecode.speculative.drafters.suffix import global_tree
    from fastdecode.speculative.memory import DrafterMemory, forget, memory_of

    memory = DrafterMemory()
    deep = global_tree(memory, 24)
    deep.extend(0, [1, 2, 3])
    shallow = global_tree(memory, 8)
    assert shallow is not deep and shallow.max_depth == 8
    assert global_tree(memory, 24) is deep and len(deep) == 1  # a run at depth 8 between two at 24 kept its history
    assert len(memory) == 2
    memory.clear()
    assert global_tree(memory, 24) is not deep and len(memory) == 1
    model = torch.nn.Linear(1, 1)  # any weak-referenceable object stands for a target model
    own = global_tree(memory_of(model), 24)
    assert memory_of(model) is memory_of(model) and global_tree(memory_of(model), 24) is own
    forget(model)
    assert len(memory_of(model)) == 0


def kid_tokens(tree: SuffixTree, node: int) -> list[int]:
    return [tree.token[kid] for kid in tree.kids[node]]


def test_equally_frequent_children_are_ordered_as_arctic_s_sibling_list():
    tree = SuffixTree(max_depth=4)
    tree.extend(0, [1, 2, 1, 3])  # new children join the back of the count-1 run
    assert kid_tokens(tree, path(tree, [1])) == [2, 3]
    tree.extend(0, [1, 2])  # 2 led the count-1 run: it leads the count-2 run
    assert kid_tokens(tree, path(tree, [1])) == [2, 3]
    tree.extend(0, [1, 3])  # 3 led the count-1 run too: it goes before 2, the most recently counted first
    assert kid_tokens(tree, path(tree, [1])) == [3, 2]
    assert draft_from(tree, path(tree, [1]), 1, 0.1).tokens == [3]  # the first draft took the first-made child, 2

    tree = SuffixTree(max_depth=4)
    tree.extend(0, [9, 5, 9, 5, 9, 6, 9, 7])  # under 9: 5 (2), 6 (1), 7 (1)
    assert kid_tokens(tree, path(tree, [9])) == [5, 6, 7]
    tree.extend(0, [9, 7])  # 7 did not lead its run: it joins the count-2 run at its back
    assert kid_tokens(tree, path(tree, [9])) == [5, 7, 6]
    tree.extend(1, [9, 6])
    tree.remove(1)  # a count going down leads the lower run
    assert kid_tokens(tree, path(tree, [9])) == [5, 7, 6]
    tree.remove(0)
    assert not tree.children[tree.root] and not tree.kids[tree.root] and tree.nodes == 1


def test_kids_stay_sorted_by_count_through_random_edits():
    g = torch.Generator().manual_seed(0)
    tree = SuffixTree(max_depth=3)
    for seq in range(30):
        tree.extend(seq, torch.randint(0, 4, (12,), generator=g).tolist())
        if seq % 3 == 2:
            tree.remove(tree.oldest())
    stack = [tree.root]
    while stack:
        node = stack.pop()
        counts = [tree.count[kid] for kid in tree.kids[node]]
        assert counts == sorted(counts, reverse=True) and all(c > 0 for c in counts)
        assert {tree.token[kid]: kid for kid in tree.kids[node]} == tree.children[node]
        stack.extend(tree.children[node].values())


def test_on_equal_scores_the_longer_match_wins():
    tree = SuffixTree(max_depth=4)
    tree.extend(0, [5, 7, 0, 5, 0, 8, 9, 0, 8, 0])  # [5] then 7 or 0; [8 9] then 0, [8] then 9 or 0
    short, long = path(tree, [5]), path(tree, [8, 9])
    assert (tree.count[short], tree.count[path(tree, [5, 7])]) == (2, 1)  # [5]: 7 at probability 0.5
    assert (tree.count[long], tree.count[path(tree, [8, 9, 0])]) == (1, 1)
    tree.extend(1, [8, 9, 6])  # [8 9] twice: 0 or 6 at probability 0.5
    assert tree.count[long] == 2
    assert best_draft(tree, [short, long], 1, 1.0, 0.0, 0.1).tokens == [0]  # both one token at 0.5: the longer
    assert best_draft(tree, [short, long], 1, 1.0, 0.0, 0.6).tokens == []


def test_defaults_follow_vllm():
    cfg = SuffixConfig()
    assert (cfg.max_depth, cfg.max_cached_requests, cfg.max_spec_factor, cfg.min_token_prob) == (24, 10000, 1.0, 0.1)
