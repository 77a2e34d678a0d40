"""The best-first draft tree of EAGLE-2 (Li et al. 2024, arXiv 2406.16858, `topK_genrate`), shared by the drafters
that grow one (spec.dyntree with a draft model, spec.eagle3 with its head): nodes scored by their log path
probability under the draft, the `width` best of the newest level expanded, and the `total` best of all kept."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Candidates:
    """Every node generated this step, in creation order (parents before children)."""

    tokens: list[int]
    parents: list[int]
    scores: list[float]  # log path probability under the draft

    def add_children(self, beam: list[int], logits: torch.Tensor, width: int) -> list[int]:
        """Give each beam node (-1 = root) its `width` likeliest children; `logits` `[len(beam), V]`. Returns them."""
        logq = logits.float().log_softmax(-1)  # [B, V]
        top = logq.topk(min(width, logq.shape[-1]), dim=-1)
        new = []
        for parent, ids, lq in zip(beam, top.indices.tolist(), top.values.clamp(max=0.0).tolist(), strict=True):
            base = self.scores[parent] if parent >= 0 else 0.0
            for x, s in zip(ids, lq, strict=True):
                if s == float("-inf"):
                    continue  # a token the draft cannot propose (outside a reduced draft vocabulary)
                new.append(len(self.tokens))
                self.tokens.append(x)
                self.parents.append(parent)
                self.scores.append(base + s)  # <= the parent's score: clamp keeps rounding from breaking this
        return new

    def ranked(self, nodes: list[int]) -> list[int]:
        """Best score first; ties go to the node created first (so a parent ranks before its children)."""
        return sorted(nodes, key=lambda i: (-self.scores[i], i))

    def full(self, beam: list[int], total: int) -> bool:
        """Whether `total` nodes already score at least the beam's best: no child of the beam could then be kept."""
        best = self.scores[beam[0]]
        return sum(s >= best for s in self.scores) >= total

    def best(self, total: int) -> tuple[list[int], list[int]]:
        """`(tokens, parents)` of the `total` best nodes in creation order (closed under ancestors: a child never
        scores above its parent), parents renumbered."""
        keep = sorted(self.ranked(list(range(len(self.tokens))))[:total])  # creation order: parents first
        index = {node: i for i, node in enumerate(keep)}
        parents = [index[self.parents[i]] if self.parents[i] >= 0 else -1 for i in keep]
        return [self.tokens[i] for i in keep], parents
