"""sparse.quest: Quest (Tang et al. 2024). Each row's tokens are cut into pages of `page` tokens; each page keeps the
per-channel minimum and maximum of its keys, so sum_d max(q_d * max_d, q_d * min_d) bounds q . k for every key of
the page from above. A step reads the bounds, then whole pages: the current (last) one, as Quest's kernels keep it,
and those with the highest bounds, `budget // page` pages in all (plus any sinks or recent tokens outside them);
the first `dense_layers` layers and the prefill are dense (`base`).

As in the authors' code, each query head scores the pages on its own (`per_query_head=True`: their evaluation code
repeats the keys per query head before it bounds them; their kernels serve heads that are not grouped) and nothing
but the current page and the step's own token is forced (`sinks=0`, `recent=1`). `per_query_head=False` sums the
bounds over a key/value head's query heads (sparse-frontier's `share_pages`), so a group reads one set of pages.

Pages are counted over each row's real tokens, so left padding never enters a page's bounds and a padded row of a
batch gets the bounds it gets alone. The bounds are kept per layer and updated only for the pages written since the
last step (`KVCache.written_since`), so choosing reads 2 / `page` of the keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..attention import register_rule
from ..config import check
from .base import Selection, Selector, SparseConfig, group_sum


@dataclass(frozen=True)
class QuestConfig(SparseConfig):
    TOP_K: ClassVar[bool] = True
    page: int = 16  # tokens per page (Quest's chunk_size)
    sinks: int = 0  # Quest forces no attention sinks
    recent: int = 1  # nor a recent window: the current page is kept instead
    per_query_head: bool = True  # Quest's default: every query head bounds the pages with its own query

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.page >= 1, "page", self.page, "must be >= 1 token")


def rank_of(real: torch.Tensor) -> torch.Tensor:
    """`[B, K]` long: each real column's rank among its row's real tokens, -1 for a column that is not a real token
    (left padding, past a ragged row's end). A column's page is its rank // `page`."""
    return torch.where(real, real.long().cumsum(-1) - 1, -1)


def row_page_bounds(k: torch.Tensor, rank: torch.Tensor, first: torch.Tensor, n: int,
                    page: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel min and max of the keys `k` `[B, H, K, D]` of each row's pages `first[b]` .. `n - 1` (`rank`:
    `[B, K]` from `rank_of`, counted from page 0 of the result): two `[B, H, n, D]` tensors, 0 for the pages before
    `first[b]` and empty ones. Each row's real keys are gathered into rank order, so a page is a slice."""
    B, H, K, D = k.shape
    use = (rank >= 0) & (rank // page >= first[:, None])
    slot = torch.where(use, rank, n * page).clamp(max=n * page)  # [B, K]: slot n * page collects the rest
    cols = torch.arange(K, device=k.device).expand(B, K)
    where = torch.full((B, n * page + 1), -1, dtype=torch.long, device=k.device).scatter_(1, slot, cols)
    where = where[:, : n * page]  # [B, n * page] the column at each rank, -1 none
    got = k.gather(2, where.clamp(min=0)[:, None, :, None].expand(B, H, n * page, D))  # [B, H, n * page, D]
    none = (where < 0)[:, None, :, None]
    lo = got.masked_fill(none, float("inf")).view(B, H, n, page, D).amin(3)
    hi = got.masked_fill(none, float("-inf")).view(B, H, n, page, D).amax(3)
    empty = lo > hi
    return lo.masked_fill(empty, 0.0), hi.masked_fill(empty, 0.0)


def page_bounds(k: torch.Tensor, page: int, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel min and max of the keys of pages `start // page` onwards of rows without padding: two
    `[B, H, P', D]` tensors."""
    B, K = k.shape[0], k.shape[2]
    rank = rank_of(torch.ones(B, K, dtype=torch.bool, device=k.device))
    n, first = -(-K // page), start // page
    lo, hi = row_page_bounds(k, rank, torch.full((B,), first, device=k.device), n, page)
    return lo[:, :, first:], hi[:, :, first:]


def bound_scores(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor,
                 per_query_head: bool = False) -> torch.Tensor:
    """Upper bound of q . k over each page: `[B, Hq, Q, D]` x `[B, Hkv, P, D]` -> `[B, Hkv, P]` (summed over the
    queries and the query heads of each key/value head), or `[B, Hq, P]` per query head."""
    B, Hkv = kmin.shape[:2]
    g = q.shape[1] // Hkv
    qg = q.reshape(B, Hkv, g * q.shape[2], 1, q.shape[3])  # [B, Hkv, gQ, 1, D]
    best = torch.maximum(qg * kmax[:, :, None], qg * kmin[:, :, None]).sum(-1)  # [B, Hkv, gQ, P]
    return group_sum(best, q.shape[2], per_query_head)


def _fit(t: torch.Tensor, n: int) -> torch.Tensor:
    """`t` `[B, H, P, D]` cut or zero-padded to `n` pages."""
    if t.shape[2] >= n:
        return t[:, :, :n]
    return torch.cat([t, t.new_zeros(*t.shape[:2], n - t.shape[2], t.shape[3])], 2)


class QuestSelector(Selector):
    cfg: QuestConfig

    def reset(self) -> None:
        self.pages: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.ids: dict[int, torch.Tensor] = {}  # layer -> [B, K] page of each column (-1: not a real token)
        self.seen: dict[int, int] = {}  # columns each layer's bounds cover

    def observe(self, layer, q, k, mask) -> None:
        B = k.shape[0]
        old = self.pages.get(layer)
        fresh = old is None or old[0].shape[0] != B
        start = 0 if fresh else min(self._dirty, self.seen.get(layer, 0))
        key = f"quest:{k.shape[2]}:{start}"  # what to redo is the same in every layer of a forward: work it out once
        if key not in self.state:
            self.state[key] = self.redo(k, mask, start)
        rank, pages, n, first, c0, p0 = self.state[key]
        page = self.cfg.page
        tail = rank[:, c0:]
        lo, hi = row_page_bounds(k[:, :, c0:], torch.where(tail >= 0, tail - p0 * page, -1), first - p0, n - p0,
                                 page)
        if not fresh and start > 0:
            assert old is not None
            if bool((first > p0).any()):  # rows whose first page to redo comes later keep their bounds up to it
                kept = (torch.arange(p0, n, device=k.device)[None] < first[:, None])[:, None, :, None]
                lo = torch.where(kept, _fit(old[0][:, :, p0:], n - p0), lo)
                hi = torch.where(kept, _fit(old[1][:, :, p0:], n - p0), hi)
            lo, hi = torch.cat([_fit(old[0], p0), lo], 2), torch.cat([_fit(old[1], p0), hi], 2)
        self.pages[layer], self.ids[layer], self.seen[layer] = (lo, hi), pages, k.shape[2]

    def redo(self, k: torch.Tensor, mask: torch.Tensor, start: int) -> tuple:
        """What a forward must summarise again when the columns from `start` on are new: each column's rank and page
        (`[B, K]`), the page count, each row's first page to redo (`[B]`), the first column and page any row
        redoes."""
        B, K = k.shape[0], k.shape[2]
        rank = rank_of(self.real_columns(k, mask))  # [B, K]
        pages = torch.where(rank >= 0, rank // self.cfg.page, -1)  # [B, K]
        n = max(1, int(pages.max()) + 1)
        if start == 0:
            first = torch.zeros(B, dtype=torch.long, device=k.device)
        else:  # each row's first page holding a column written since the last look
            tail = pages[:, start:]
            first = torch.where(tail >= 0, tail, n).amin(-1) if tail.shape[1] else torch.full_like(pages[:, 0], n)
        # the first column of any row's first page to redo: everything before it is summarised already
        again = pages >= first[:, None]  # [B, K]
        c0 = int(torch.where(again.any(-1), again.int().argmax(-1), K).min())
        p0 = min(int(first.min()), n)  # pages before p0 are summarised in every row
        return rank, pages, n, first, c0, p0

    def choose(self, layer, q, k, mask, visible) -> Selection:
        kmin, kmax = self.pages[layer]
        pages = self.ids[layer]  # [B, K]
        self.add_reads(2 * kmin.shape[0] * kmin.shape[1] * kmin.shape[2])
        scores = bound_scores(q, kmin, kmax, self.cfg.per_query_head).float()  # [B, H, P]
        B, H, P = scores.shape
        page = self.cfg.page
        slot = torch.where(visible & (pages >= 0), pages, P)  # [B, K]
        seen = torch.zeros(B, P + 1, dtype=torch.bool, device=k.device).scatter_(1, slot, True)[:, :P]  # [B, P]
        scores = scores.masked_fill(~seen[:, None], float("-inf"))
        current = pages.amax(-1).clamp(min=0)[:, None, None].expand(B, H, 1)  # the row's last page, always kept
        scores = scores.scatter(2, current, float("inf"))
        n = min(max(1, self.cfg.budget // page), P)  # whole pages, as Quest reads them
        val, idx = scores.topk(n, -1)  # [B, H, n]
        idx = idx.masked_fill(val == float("-inf"), P)  # P: no page
        cols = page_columns(pages, visible, idx, page, P)  # [B, H, n * page]
        chosen = torch.zeros(B, H, P + 1, dtype=torch.bool, device=k.device).scatter_(2, idx, True)
        return Selection(torch.cat([cols, self.forced(pages, visible, chosen)], -1))

    def forced(self, pages: torch.Tensor, visible: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """`[B, H, a]` the sinks and recent columns (`base.always`) that lie outside the chosen pages (`chosen`:
        `[B, H, P + 1]` bool), -1 elsewhere."""
        keep = self.always(visible)  # [B, K]
        B, H, P = chosen.shape[0], chosen.shape[1], chosen.shape[2] - 1
        a = int(keep.sum(-1).max())
        if a == 0:
            return pages.new_full((B, H, 0), -1)
        kv, ki = keep.to(torch.int8).topk(a, -1)  # [B, a]
        page_of_col = pages.gather(1, ki)
        where = torch.where((kv > 0) & (page_of_col >= 0), page_of_col, P)  # [B, a]
        inside = chosen.gather(2, where[:, None].expand(B, H, a)) & (where < P)[:, None]
        return ki[:, None].expand(B, H, a).masked_fill(inside | (kv == 0)[:, None], -1)


def page_columns(pages: torch.Tensor, visible: torch.Tensor, idx: torch.Tensor, page: int, P: int) -> torch.Tensor:
    """`[B, H, n * page]` the visible columns of the pages `idx` (`[B, H, n]`, `P` = none) of each row, -1 where a
    page has fewer (the current page, or none). `pages`: `[B, K]` each column's page (-1 none), `P` pages in all."""
    B, K = pages.shape
    H, n = idx.shape[1], idx.shape[2]
    col = torch.arange(K, device=pages.device).expand(B, K)
    slot = torch.where(pages >= 0, pages, P)
    first = torch.full((B, P + 1), K, device=pages.device).scatter_reduce(1, slot, col, "amin")  # [B, P+1]
    first[:, -1] = K
    cols = first.gather(1, idx.reshape(B, -1)).reshape(B, H, n, 1) + torch.arange(page, device=pages.device)
    safe = cols.clamp(max=K - 1).reshape(B, -1)  # [B, H*n*page]
    ok = (cols < K) & (pages.gather(1, safe) == idx.reshape(B, -1).repeat_interleave(page, 1)).reshape(cols.shape)
    ok &= visible.gather(1, safe).reshape(cols.shape)
    return cols.masked_fill(~ok, -1).reshape(B, H, n * page)


register_rule(
    "quest", QuestSelector, QuestConfig,
    description="Quest: per-page key min/max bounds, the current page and the pages with the highest bounds.",
)
