"""A depth-bounded suffix tree (an uncompressed suffix trie) with occurrence counts, for SuffixDecoding.

Every substring of up to `max_depth` tokens of the added sequences is a node whose `count` is the number of
its occurrences; sequences grow one token at a time and can be removed again (FIFO eviction of a global
tree). A draft follows the most frequent child (path mode) or grows a tree best-first by path probability
(tree mode), and is scored by the sum of its path probabilities (Oliaro et al. 2024, "SuffixDecoding", §3).

Children are kept in the order of ArcticInference's sibling list (`csrc/suffix_decoding/suffix_tree.cc`), which
decides between equally frequent children: by count, most first; a new child joins the end of its count's run;
a child whose count goes up joins the next run at its front if it led its old run, else at its back; a child whose
count goes down leads the next lower run.

A node is an integer (the root 0) indexing flat per-node lists, its children an int -> int dict and its sibling
list a tuple of ints: containers Python's cycle collector does not track, so that a tree of many nodes adds nothing
for it to walk. With a node as an object (itself, a dict and a list: three tracked objects), a tree over 839 tokens
(18,069 nodes) made ~54,000 tracked objects, enough to start a full collection every few generations, each pausing
the process ~0.2 s (docs/gpu.md, "Host work per step"). Freed nodes are reused.
"""

from __future__ import annotations

import heapq
import itertools
from bisect import bisect_left
from collections import OrderedDict
from dataclasses import dataclass

ROOT = 0


@dataclass(frozen=True)
class SuffixDraft:
    tokens: list[int]
    score: float  # sum over drafted tokens of the path probability prod(child.count / parent.count)
    parents: list[int] | None = None  # tree mode: each token's parent in `tokens`, -1 under the root; None: a chain


class SuffixTree:
    """Nodes are ints; `count[n]` its occurrences, `depth[n]` its length in tokens, `token[n]` its last token,
    `children[n]` token -> node, `kids[n]` its children in Arctic's sibling order (most frequent first)."""

    root = ROOT

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.count: list[int] = [0]
        self.depth: list[int] = [0]
        self.token: list[int] = [-1]
        self.children: list[dict[int, int]] = [{}]
        self.kids: list[tuple[int, ...]] = [()]
        self._free: list[int] = []  # nodes whose substring no sequence holds any more, for reuse
        self._open: dict[int, list[int]] = {}  # per sequence: nodes of its suffixes shorter than max_depth
        self._tokens: OrderedDict[int, list[int]] = OrderedDict()  # per sequence, oldest first

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def nodes(self) -> int:
        """Nodes in use, the root included."""
        return len(self.count) - len(self._free)

    def extend(self, seq: int, tokens: list[int]) -> None:
        """Append tokens to sequence `seq` (created on first use), counting each new suffix."""
        open_nodes = self._open.setdefault(seq, [])
        self._tokens.setdefault(seq, []).extend(tokens)
        children, depth, limit = self.children, self.depth, self.max_depth
        for t in tokens:
            grown = []
            for node in [ROOT, *open_nodes]:
                child = children[node].get(t)
                if child is None:
                    child = self._add_child(node, t)
                else:
                    self._increment(node, child)
                if depth[child] < limit:
                    grown.append(child)
            open_nodes[:] = grown

    def remove(self, seq: int) -> None:
        """Forget sequence `seq`: undo the counts of all its substrings."""
        tokens = self._tokens.pop(seq, [])
        self._open.pop(seq, None)
        for start in range(len(tokens)):
            node = ROOT
            for t in tokens[start : start + self.max_depth]:
                child = self.children[node][t]
                if self._decrement(node, child):
                    break
                node = child

    def oldest(self) -> int | None:
        return next(iter(self._tokens), None)

    def suffix_nodes(self, seq: int) -> list[int]:
        """Nodes of sequence `seq`'s own suffixes, shortest first (its last token, last two tokens, ...)."""
        return list(self._open.get(seq, []))

    def match(self, context: list[int]) -> list[int]:
        """Nodes of the context's suffixes present in the tree, shortest first; as Arctic's `speculate`, of at most
        min(len(context), max_depth) - 1 tokens (the context cut to max_depth tokens, never all of it)."""
        found: list[int] = []
        for m in range(1, min(len(context), self.max_depth)):
            node = ROOT
            for t in context[len(context) - m :]:
                child = self.children[node].get(t)
                if child is None:
                    return found  # a longer suffix contains this one, so it cannot be present either
                node = child
            found.append(node)
        return found

    def _add_child(self, node: int, token: int) -> int:
        if self._free:
            child = self._free.pop()
            self.count[child], self.depth[child], self.token[child] = 1, self.depth[node] + 1, token
        else:
            child = len(self.count)
            self.count.append(1)
            self.depth.append(self.depth[node] + 1)
            self.token.append(token)
            self.children.append({})
            self.kids.append(())
        self.children[node][token] = child
        self.kids[node] += (child,)  # the back of the count-1 run
        return child

    def _runs_from(self, kids: tuple[int, ...], c: int) -> int:
        """Index of the first child with count <= c (the children are sorted by count, most first)."""
        count = self.count
        return bisect_left(kids, -c, key=lambda kid: -count[kid])

    def _increment(self, node: int, child: int) -> None:
        count, kids = self.count, self.kids[node]
        c = count[child]
        if kids[0] == child:  # the first child stays first
            count[child] = c + 1
            return
        i = kids.index(child)
        led = count[kids[i - 1]] != c  # it led the run of its count
        rest = kids[:i] + kids[i + 1 :]
        count[child] = c + 1
        at = self._runs_from(rest, c + 1 if led else c)
        self.kids[node] = rest[:at] + (child,) + rest[at:]

    def _decrement(self, node: int, child: int) -> bool:
        """One occurrence fewer of `child`; True where it had none left and went, with its subtree."""
        kids = self.kids[node]
        i = kids.index(child)
        rest = kids[:i] + kids[i + 1 :]
        self.count[child] -= 1
        if self.count[child] == 0:
            del self.children[node][self.token[child]]
            self.kids[node] = rest
            self._release(child)
            return True
        at = self._runs_from(rest, self.count[child])
        self.kids[node] = rest[:at] + (child,) + rest[at:]
        return False

    def _release(self, node: int) -> None:
        """Free `node` and its subtree (no sequence holds their substrings: each occurs within the node's)."""
        stack = [node]
        while stack:
            n = stack.pop()
            stack.extend(self.children[n].values())
            self.children[n], self.kids[n], self.count[n] = {}, (), 0
            self._free.append(n)


def draft_from(tree: SuffixTree, node: int, max_tokens: int, min_token_prob: float) -> SuffixDraft:
    """Follow the most frequent child (the first in sibling order) while the path probability stays >=
    min_token_prob."""
    count, kids, token = tree.count, tree.kids, tree.token
    tokens: list[int] = []
    score, prob = 0.0, 1.0
    while len(tokens) < max_tokens and kids[node]:
        child = kids[node][0]
        prob *= count[child] / count[node]
        if prob < min_token_prob:
            break
        tokens.append(token[child])
        score += prob
        node = child
    return SuffixDraft(tokens, score)


def tree_from(tree: SuffixTree, node: int, max_tokens: int, min_token_prob: float) -> SuffixDraft:
    """Grow a draft tree of at most `max_tokens` nodes best-first: always add the candidate continuation with the
    highest path probability (>= min_token_prob), then offer its children. Siblings are distinct tokens."""
    count, kids, token = tree.count, tree.kids, tree.token
    tokens: list[int] = []
    parents: list[int] = []
    score = 0.0
    order = itertools.count()  # ties: the first offered wins (children are offered in sibling order)
    heap = [(-count[child] / count[node], next(order), child, -1) for child in kids[node]]
    heapq.heapify(heap)
    while heap and len(tokens) < max_tokens:
        neg, _, child, parent = heapq.heappop(heap)
        prob = -neg
        if prob < min_token_prob:
            break  # every other candidate is less likely still
        tokens.append(token[child])
        parents.append(parent)
        score += prob
        here = len(tokens) - 1
        for grandchild in kids[child]:
            heapq.heappush(heap, (-prob * count[grandchild] / count[child], next(order), grandchild, here))
    return SuffixDraft(tokens, score, parents)


def best_draft(tree: SuffixTree, nodes: list[int], max_spec_tokens: int, factor: float, offset: float,
               min_token_prob: float, tree_mode: bool = False) -> SuffixDraft:
    """Best-scoring draft over the matched suffixes (shortest first); a match of m tokens may draft
    floor(m * factor + offset) tokens (a chain of that length, or a tree of that many nodes). On equal scores the
    longer match wins, as in Arctic's `speculate`."""
    best = SuffixDraft([], 0.0, [] if tree_mode else None)
    grow = tree_from if tree_mode else draft_from
    for node in nodes:
        limit = max(min(max_spec_tokens, int(tree.depth[node] * factor + offset + 1e-6)), 0)
        draft = grow(tree, node, limit, min_token_prob)
        if draft.score >= best.score:
            best = draft
    return best
