"""The draft model's side of a token tree, shared by the tree drafters that run a separate draft model
(spec.rsd, spec.dyntree): its own KV cache, the unseen context fed once per step, then the tree grown one
forward per depth, every node of a level in the same forward under a tree attention mask."""

from __future__ import annotations

import torch

from ..models.causal import CausalLM


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


def _ancestors(parents: list[int], node: int) -> set[int]:
    """The node and its ancestors (-1, the root, excluded)."""
    out = set()
    while node >= 0:
        out.add(node)
        node = parents[node]
    return out
