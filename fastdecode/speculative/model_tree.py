"""The draft model's side of a token tree, shared by the tree drafters that run a separate draft model
(spec.rsd, spec.dyntree): its own KV cache, the unseen context fed once per step, then the tree grown one
forward per depth, every node of a level in the same forward under a tree attention mask."""

from __future__ import annotations

import torch

from ..models.causal import CausalLM


class DraftModelTree:
    """Feeds a draft model the context and then chosen nodes of a tree (`tokens`, `parents` as in `tree.py`).

    After `start(context)` the cache holds the context; `grow` appends nodes whose ancestors were all fed, each
    attending to the context and its ancestors, at position (last context position + depth). The next `start`
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

    def grow(self, tokens: list[int], parents: list[int], feed: list[int]) -> torch.Tensor:
        """Feed the nodes `feed` of the tree in one forward; returns their logits `[len(feed), V]`."""
        n, device = self._n, self.model.device
        fed = self._fed + feed
        lineage = [_ancestors(parents, i) for i in feed]  # each node with its ancestors
        C, Q = self.cache.length, len(feed)
        allow = torch.zeros(Q, C + Q, dtype=torch.bool)
        allow[:, :n] = True
        for row, line in enumerate(lineage):
            allow[row, n:] = torch.tensor([f in line for f in fed])
        blocked = torch.finfo(self.model.dtype).min
        mask = torch.zeros(Q, C + Q, dtype=self.model.dtype).masked_fill(~allow, blocked)[None, None].to(device)
        ids = torch.tensor([tokens[i] for i in feed], device=device)[None]  # [1, Q]
        pos = torch.tensor([n - 1 + len(line) for line in lineage], device=device)[None]  # depth = len(line)
        logits = self.model.forward(ids, pos, self.cache, mask, num_logits=Q)[0]  # [Q, V]
        self.forwards += 1
        self._fed = fed
        return logits


def _ancestors(parents: list[int], node: int) -> set[int]:
    """The node and its ancestors (-1, the root, excluded)."""
    out = set()
    while node >= 0:
        out.add(node)
        node = parents[node]
    return out
