"""A depth-bounded suffix tree (an uncompressed suffix trie) with occurrence counts, for SuffixDecoding.

Every substring of up to `max_depth` tokens of the added sequences is a node whose `count` is the number of
its occurrences; sequences grow one token at a time and can be removed again (FIFO eviction of a global
tree). A draft follows the most frequent child (path mode) or grows a tree best-first by path probability
(tree mode), and is scored by the sum of its path probabilities (Oliaro et al. 2024, "SuffixDecoding", §3).

Children are kept in the order of ArcticInference's sibling list (`csrc/suffix_decoding/suffix_tree.cc`), which
decides between equally frequent children: by count, most first; a new child joins the end of its count's run;
a child whose count goes up joins the next run at its front if it led its old run, else at its back; a child whose
count goes down leads the next lower run.
"""

from __future__ import annotations

import heapq
import itertools
from bisect import bisect_left
from collections import OrderedDict
from dataclasses import dataclass


class Node:
    __slots__ = ("count", "depth", "children", "kids")

    def __init__(self, depth: int) -> None:
        self.count = 0
        self.depth = depth
        self.children: dict[int, Node] = {}  # token -> child
        self.kids: list[tuple[int, Node]] = []  # (token, child) in Arctic's sibling order


def _runs_from(kids: list[tuple[int, Node]], c: int) -> int:
    """Index of the first child with count <= c (the children are sorted by count, most first)."""
    return bisect_left(kids, -c, key=lambda kid: -kid[1].count)


def _add_child(node: Node, token: int) -> Node:
    child = node.children[token] = Node(node.depth + 1)
    child.count = 1
    node.kids.append((token, child))  # the back of the count-1 run
    return child


def _increment(node: Node, token: int, child: Node) -> None:
    c = child.count
    i = node.kids.index((token, child))
    led = i == 0 or node.kids[i - 1][1].count != c  # it led the run of its count
    del node.kids[i]
    child.count = c + 1
    node.kids.insert(_runs_from(node.kids, c + 1 if led else c), (token, child))


def _decrement(node: Node, token: int, child: Node) -> None:
    i = node.kids.index((token, child))
    del node.kids[i]
    child.count -= 1
    if child.count == 0:
        del node.children[token]
    else:
        node.kids.insert(_runs_from(node.kids, child.count), (token, child))


@dataclass(frozen=True)
class SuffixDraft:
    tokens: list[int]
    score: float  # sum over drafted tokens of the path probability prod(child.count / parent.count)
    parents: list[int] | None = None  # tree mode: each token's parent in `tokens`, -1 under the root; None: a chain


class SuffixTree:
    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.root = Node(0)
        self._open: dict[int, list[Node]] = {}  # per sequence: nodes of its suffixes shorter than max_depth
        self._tokens: OrderedDict[int, list[int]] = OrderedDict()  # per sequence, oldest first

    def __len__(self) -> int:
        return len(self._tokens)

    def extend(self, seq: int, tokens: list[int]) -> None:
        """Append tokens to sequence `seq` (created on first use), counting each new suffix."""
        open_nodes = self._open.setdefault(seq, [])
        self._tokens.setdefault(seq, []).extend(tokens)
        for t in tokens:
            grown = []
            for node in [self.root, *open_nodes]:
                child = node.children.get(t)
                if child is None:
                    child = _add_child(node, t)
                else:
                    _increment(node, t, child)
                if child.depth < self.max_depth:
                    grown.append(child)
            open_nodes[:] = grown

    def remove(self, seq: int) -> None:
        """Forget sequence `seq`: undo the counts of all its substrings."""
        tokens = self._tokens.pop(seq, [])
        self._open.pop(seq, None)
        for start in range(len(tokens)):
            node = self.root
            for t in tokens[start : start + self.max_depth]:
                child = node.children[t]
                _decrement(node, t, child)
                if child.count == 0:
                    break
                node = child

    def oldest(self) -> int | None:
        return next(iter(self._tokens), None)

    def suffix_nodes(self, seq: int) -> list[Node]:
        """Nodes of sequence `seq`'s own suffixes, shortest first (its last token, last two tokens, ...)."""
        return list(self._open.get(seq, []))

    def match(self, context: list[int]) -> list[Node]:
        """Nodes of the context's suffixes present in the tree, shortest first; as Arctic's `speculate`, of at most
        min(len(context), max_depth) - 1 tokens (the context cut to max_depth tokens, never all of it)."""
        found: list[Node] = []
        for m in range(1, min(len(context), self.max_depth)):
            node = self.root
            for t in context[len(context) - m :]:
                child = node.children.get(t)
                if child is None:
                    return found  # a longer suffix contains this one, so it cannot be present either
                node = child
            found.append(node)
        return found


def draft_from(node: Node, max_tokens: int, min_token_prob: float) -> SuffixDraft:
    """Follow the most frequent child (the first in sibling order) while the path probability stays >=
    min_token_prob."""
    tokens: list[int] = []
    score, prob = 0.0, 1.0
    while len(tokens) < max_tokens and node.kids:
        token, child = node.kids[0]
        prob *= child.count / node.count
        if prob < min_token_prob:
            break
        tokens.append(token)
        score += prob
        node = child
    return SuffixDraft(tokens, score)


def tree_from(node: Node, max_tokens: int, min_token_prob: float) -> SuffixDraft:
    """Grow a draft tree of at most `max_tokens` nodes best-first: always add the candidate continuation with the
    highest path probability (>= min_token_prob), then offer its children. Siblings are distinct tokens."""
    tokens: list[int] = []
    parents: list[int] = []
    score = 0.0
    order = itertools.count()  # ties: the first offered wins (children are offered in sibling order)
    heap = [(-child.count / node.count, next(order), token, child, -1) for token, child in node.kids]
    heapq.heapify(heap)
    while heap and len(tokens) < max_tokens:
        neg, _, token, child, parent = heapq.heappop(heap)
        prob = -neg
        if prob < min_token_prob:
            break  # every other candidate is less likely still
        tokens.append(token)
        parents.append(parent)
        score += prob
        here = len(tokens) - 1
        for t, grandchild in child.kids:
            heapq.heappush(heap, (-prob * grandchild.count / child.count, next(order), t, grandchild, here))
    return SuffixDraft(tokens, score, parents)


def best_draft(nodes: list[Node], max_spec_tokens: int, factor: float, offset: float, min_token_prob: float,
               tree: bool = False) -> SuffixDraft:
    """Best-scoring draft over the matched suffixes (shortest first); a match of m tokens may draft
    floor(m * factor + offset) tokens (a chain of that length, or a tree of that many nodes). On equal scores the
    longer match wins, as in Arctic's `speculate`."""
    best = SuffixDraft([], 0.0, [] if tree else None)
    grow = tree_from if tree else draft_from
    for node in nodes:
        limit = max(min(max_spec_tokens, int(node.depth * factor + offset + 1e-6)), 0)
        draft = grow(node, limit, min_token_prob)
        if draft.score >= best.score:
            best = draft
    return best
