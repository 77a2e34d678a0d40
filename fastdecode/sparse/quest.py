"""sparse.quest: Quest (Tang et al. 2024). The cache is cut into pages of `page` tokens; each page keeps the
per-channel minimum and maximum of its keys, so sum_d max(q_d * max_d, q_d * min_d) bounds q . k for every key of
the page from above. A step reads the bounds, then the pages with the highest bounds (summed over a key/value
head's query heads, as sparse-frontier shares pages across a GQA group) up to the budget; sinks, the recent
window and the first `dense_layers` layers as in `base`.

The bounds are kept per layer and updated only for pages written since the last step (`KVCache.written_since`),
so choosing reads 2 / `page` of the keys."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..attention import register_rule
from ..config import check
from .base import Selection, Selector, SparseConfig


@dataclass(frozen=True)
class QuestConfig(SparseConfig):
    page: int = 16  # tokens per page (Quest's chunk_size)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.page >= 1, "page", self.page, "must be >= 1 token")


def page_bounds(k: torch.Tensor, page: int, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel min and max of the keys of pages `start // page` onwards: two `[B, H, P', D]` tensors."""
    first = (start // page) * page
    chunk = k[:, :, first:]
    n = chunk.shape[2]
    pad = -n % page
    lo = F.pad(chunk, (0, 0, 0, pad), value=float("inf"))
    hi = F.pad(chunk, (0, 0, 0, pad), value=float("-inf"))
    shape = (*k.shape[:2], (n + pad) // page, page, k.shape[-1])
    return lo.view(shape).amin(3), hi.view(shape).amax(3)


def bound_scores(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor) -> torch.Tensor:
    """Upper bound of q . k over each page: `[B, Hq, Q, D]` x `[B, Hkv, P, D]` -> `[B, Hkv, P]` (summed over the
    queries and the query heads of each key/value head)."""
    B, Hkv = kmin.shape[:2]
    g = q.shape[1] // Hkv
    qg = q.reshape(B, Hkv, g * q.shape[2], 1, q.shape[3])  # [B, Hkv, gQ, 1, D]
    best = torch.maximum(qg * kmax[:, :, None], qg * kmin[:, :, None]).sum(-1)  # [B, Hkv, gQ, P]
    return best.sum(2)


class QuestSelector(Selector):
    cfg: QuestConfig

    def reset(self) -> None:
        self.pages: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.seen: dict[int, int] = {}  # columns each layer's bounds cover

    def observe(self, layer, q, k, mask) -> None:
        page = self.cfg.page
        old = self.pages.get(layer)
        start = min(self._dirty, self.seen.get(layer, 0)) if old is not None else 0
        lo, hi = page_bounds(k, page, start)
        keep = start // page
        if keep == 0 or old is None:
            self.pages[layer] = (lo, hi)
        else:
            self.pages[layer] = (torch.cat([old[0][:, :, :keep], lo], 2), torch.cat([old[1][:, :, :keep], hi], 2))
        self.seen[layer] = k.shape[2]

    def choose(self, layer, q, k, mask, visible) -> Selection:
        kmin, kmax = self.pages[layer]
        self.add_reads(2 * kmin.shape[0] * kmin.shape[1] * kmin.shape[2])
        scores = bound_scores(q, kmin, kmax)  # [B, Hkv, P]
        per_col = scores.repeat_interleave(self.cfg.page, dim=-1)[..., : k.shape[2]]
        return Selection(self.top(per_col, visible))


register_rule(
    "quest", QuestSelector, QuestConfig,
    description="Quest: per-page key min/max bounds, the pages with the highest bounds up to the budget.",
)
