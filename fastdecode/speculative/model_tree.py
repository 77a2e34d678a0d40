"""The draft model's side of a token tree, shared by the tree drafters that run a separate draft model
(spec.rsd, spec.dyntree): its own KV cache, the unseen context fed once per step, then the tree grown one
forward per depth, every node of a level in the same forward under a tree attention mask.

Where the draft model runs CUDA graphs (exact mode's fixed shapes, models/graphs.py), a best-first tree grown to its
full depth (no early stop: nothing is read while it grows) is one computation of fixed shapes from the root's
logits to the kept tree, every level's beam, tree mask, draft forward and children included: `best_first` captures
it as one graph and replays it each step (`TreeGraph`), where the level-by-level path launches each level's forward
and about 35 bookkeeping operations of its own from the host (docs/gpu.md, "A best-first tree in one graph")."""

from __future__ import annotations

from typing import Any

import torch

from ..models.causal import CausalLM
from ..models.graphs import static_forward
from .best_first import BestFirst, kept_draft
from .drafter import Draft
from .step_graph import StepGraph, StepGraphs
from .tree import DeviceTree


class DraftModelTree:
    """Feeds a draft model the context and then chosen nodes of a tree (`tokens`, `parents` as in `tree.py`).

    After `start(context)` the cache holds the context; `grow` appends nodes whose ancestors were all fed, each
    attending to the context and its ancestors, at position (last context position + depth); `feed` does the same
    for a tree that keeps its own record of who sees whom (`best_first.BestFirst`, on the device). The next `start`
    drops the tree from the cache (the accepted path comes back as context), so no cache surgery is needed.
    """

    def __init__(self, model: CausalLM) -> None:
        self.model = model
        self.cache = model.new_cache()
        self.forwards = 0
        self._n = 0  # context length at the last start
        self._fed: list[int] = []  # tree nodes held in the cache after the context, in cache order
        # `best_first`'s graphs: their captures and replays, and why they stopped if a capture failed for the draft
        # model (its trees then grow level by level, the same trees)
        self.graphs = StepGraphs("the draft model's tree", shared=StepGraphs.of(model, "the draft model's tree"))

    def start(self, context: torch.Tensor) -> torch.Tensor:
        """Feed the context the cache has not seen (`[N]`, extending the last one); returns the root's logits `[V]`."""
        self.cache.crop(self._n)  # keep the previous context, drop the previous tree
        n, device = context.numel(), self.model.device
        feed = context[self._n :].to(device)[None]  # [1, N - n_prev], at least the last token
        pos = torch.arange(self._n, n, device=device)[None]
        logits = self.model.forward(feed, pos, self.cache, num_logits=1)[0, -1]  # [V]
        self.forwards += 1
        self._n, self._fed = n, []
        return logits

    def grow(self, tokens: torch.Tensor, parents: list[int], feed: list[int]) -> torch.Tensor:
        """Feed the nodes `feed` of the tree (`tokens` `[T]`, wherever they are: nothing is read), all of one depth, in
        one forward; returns their logits `[len(feed), V]`."""
        fed = self._fed + feed
        lineage = [_ancestors(parents, i) for i in feed]  # each node with its ancestors
        sees = torch.tensor([[f in line for f in fed] for line in lineage], dtype=torch.bool)  # [Q, len(fed)]
        self._fed = fed
        return self.feed(tokens[torch.tensor(feed, device=tokens.device)], sees, len(lineage[0]))

    def feed(self, ids: torch.Tensor, sees: torch.Tensor, depth: int) -> torch.Tensor:
        """Feed `ids` `[Q]`, nodes at `depth`, in one forward; `sees` `[Q, F]` bool over the tree nodes fed so far
        (these last): each node's ancestors and itself. Built where the draft is when `sees` is (nothing is read).
        Returns their logits `[Q, V]`."""
        n, device = self._n, self.model.device
        Q = ids.numel()
        allow = torch.cat([torch.ones(Q, n, dtype=torch.bool, device=sees.device), sees], 1)  # [Q, C + Q]
        blocked = torch.finfo(self.model.dtype).min
        mask = torch.zeros(allow.shape, dtype=self.model.dtype, device=sees.device).masked_fill(~allow, blocked)
        pos = torch.full((1, Q), n - 1 + depth, device=device)
        logits = self.model.forward(ids.to(device)[None], pos, self.cache, mask[None, None].to(device), num_logits=Q)
        self.forwards += 1
        return logits[0]  # [Q, V]

    @torch.inference_mode()  # (the cache's tensors are the forward's inference tensors, written in place)
    def best_first(self, root: torch.Tensor, width: int, total: int, levels: int) -> Draft | None:
        """EAGLE-2's best-first tree (`BestFirst`: `width` children a node, `width` nodes expanded a level, `total`
        kept) grown from the root's logits `[V]` (after `start`) to `levels` deep without an early stop, in one
        captured graph replayed each step: the same tree as `BestFirst.grow` with `feed` gives, and the same cache
        columns written. None, with nothing done, where it cannot run: the draft model without graphs (or with a
        capture that failed before), a beam wider than exact mode's block, a tree of one level, a cache whose
        storage is not allocated yet (the level-by-level path allocates it; the next step captures)."""
        model = self.model
        cache: Any = self.cache  # (graphable: it offers `ready_for`, `advance`, `key_width`, `graphs`, `place`, ...)
        graphs, exact = model.graphs, model.exact
        Q = min(width, root.shape[-1])  # every level's beam: each of its nodes has `width` children
        if (graphs is None or exact is None or self.graphs.failed is not None or not cache.graphable()
                or levels < 2 or Q > exact.width):
            return None
        W, n = exact.width, self._n
        if not cache.ready_for((levels - 2) * Q + W):  # the last level's padded block, the levels before it kept
            return None
        # the host's half of the levels' forwards: each takes W columns after the last and keeps its Q nodes' (the
        # device's half, `KVCache.place`, runs in the graph); the key width is the storage's in exact mode
        for _ in range(levels - 1):
            base = cache.advance(1, W)
            cache.crop_rows([base[0] + Q])
        K = cache.key_width
        key = ("best_first", width, total, levels, W, K, *graphs.settings())
        entry = cache.graphs.get(key)
        fresh = entry is None
        if entry is None:
            entry = TreeGraph(graphs.native, width, total, levels, Q, W, K, model.pad_token_id, root)
        entry.root.copy_(root)
        entry.n.copy_(torch.tensor([n]), non_blocking=True)
        try:
            # (on an error, what the levels wrote is past the context: the level-by-level path writes it again)
            out = self.graphs.run(entry, fresh, cache, graphs.mode == "cuda", root.device,
                                  lambda: cache.crop_rows([n]))
        finally:
            cache.end()
        if out is None:
            return None
        if fresh:
            cache.add_graph(key, entry)
        self.forwards += levels - 1
        scores, ids, parents, mask, first = out
        return kept_draft(scores, ids, DeviceTree(parents, levels, mask=mask, first=first), levels)


class TreeGraph(StepGraph):
    """`DraftModelTree.best_first`'s graph: the static inputs (the root's logits, the context's length) and the body
    (every level's beam, tree mask and draft forward, then the kept nodes: device operations on fixed shapes only),
    whose outputs are the kept nodes' scores, tokens and parents, their ancestor mask and branch-first order (which
    the verification would otherwise build). Kept in the draft cache's graphs (by its shapes and settings), which a
    cache that moves its storage retires, and hands to the model's next cache with its storage."""

    def __init__(self, native: Any, width: int, total: int, levels: int, Q: int, W: int, K: int, pad_id: int,
                 root: torch.Tensor) -> None:
        super().__init__()
        self.native = native  # the draft model's direct forward
        self.width, self.total, self.levels = width, total, levels
        self.Q, self.W, self.K = Q, W, K  # each level's beam; exact mode's block (a level's forward); the key width
        self.pad_id = pad_id
        self.root = torch.zeros_like(root, dtype=torch.float32)  # [V]
        self.n = torch.ones(1, dtype=torch.long, device=root.device)  # the context's length (its last position + 1)

    def body(self, cache: Any) -> tuple[torch.Tensor, ...]:
        Q, W, K, device = self.Q, self.W, self.K, self.root.device
        nodes = BestFirst(self.width, self.total, device)
        nodes.add_children(self.root[None])
        k = torch.arange(K, device=device)
        context = (k < self.n)[None].expand(Q, K)  # [Q, K] the context's columns
        eye = torch.eye(W, dtype=torch.bool, device=device)[None]  # a level's nodes see themselves, no sibling
        real = torch.ones(1, W, dtype=torch.bool, device=device)
        for depth in range(1, self.levels):
            beam = nodes.beam()
            F = nodes.fed - Q  # tree nodes stored before this level, at columns n .. n + F - 1
            start = self.n + F
            meta = torch.cat([start, start.new_full((1,), Q)])[None]  # [1, 2]
            ids = torch.zeros(1, W, dtype=torch.long, device=device)
            ids[0, :Q] = beam.tokens
            positions = (self.n + (depth - 1)).expand(1, W)
            past = torch.ones(1, W, K, dtype=torch.bool, device=device)
            seen = context.clone()
            if F:
                seen.scatter_(1, self.n + torch.arange(F, device=device)[None].expand(Q, F), beam.sees[:, :F])
            past[0, :Q] = seen
            logits, _, _ = static_forward(self.native, cache, meta, ids, positions, real, eye, past, K, self.pad_id)
            nodes.add_children(logits[0, :Q], beam)
        scores, ids, parents = nodes._kept()
        tree = DeviceTree.shaped(parents, self.levels)  # (what the verification builds from it, built here)
        assert tree.mask is not None and tree.first is not None
        return scores, ids, parents, tree.mask, tree.first


def _ancestors(parents: list[int], node: int) -> set[int]:
    """The node and its ancestors (-1, the root, excluded)."""
    out = set()
    while node >= 0:
        out.add(node)
        node = parents[node]
    return out
