"""The driver's model calls: a full forward per step, or a cached forward of only some columns.

Caches compose with every policy, because they only decide which canvas columns a forward recomputes;
the K/V of the other columns are read from the cache (stale where the canvas changed since):

- `prefix` (Fast-dLLM): recompute the view and everything after it; the prefix before the view is cached.
- `dual` (Fast-dLLM): recompute only the view; prefix and suffix are cached.
- `suffix`: recompute the prompt, the decoded prefix and the view; only the masks after the view are cached.
  The mirror of `prefix`, for models whose prompt K/V shift as the answer fills in: on the zoo's dlm-small the
  dual cache loses accuracy on the suite's canvases and this one none (measured in docs/methods.md).
  The three refresh (one full forward, whose logits also serve the step) when the view's block changes.
- `window` (Window-Diffusion, window.py): recompute the view, the first masks and the tokens committed since the
  last full forward; masks past a window are pruned from attention; a full refresh every 32 steps.
- `delayed` (dKV-Cache-Decode): recompute every column whose K/V are not cached yet, i.e. the masks and
  the tokens committed at the previous step; a token's K/V are cached one step after its commit.

`cache_refresh=n` adds a full refresh every n steps (for `delayed` by default every 8); with n = 1 every
forward is full, which gives exactly the uncached result. `recap=k` replaces these refreshes by ReCAP's
schedule (recap.py): warm-up steps all full, then one full forward per k cheap ones. Canvases may shrink
between calls (End-of-Text Prediction drops the columns after an EOS); the cache is cut with them. They may also
grow (a `Growing` policy appends masks): the cache is widened with empty columns, which the rows that did not grow
hide from attention, and the rows that grew are refreshed by a full forward at their next step (`grow`).
"""

from __future__ import annotations

import torch

from ..errors import IncompatibleMethodError
from ..models.diffusion import DenoisingModel
from . import window
from .policy import DiffusionConfig
from .recap import recap_refresh

DELAYED_REFRESH = 8  # dKV-Cache's `cache_reloading_step`


class Forwarder:
    """Logits over each entry's view, computed the way `cfg.cache` says.

    An entry is one canvas to run, tagged with its batch `row`; several entries may share a row (the
    drafts of `dlm.freedave`), so a call computes K/V for every entry but the cache only stores them
    for the entries passed to `keep`.
    """

    def __init__(self, model: DenoisingModel, cfg: DiffusionConfig, rows: int, method: str) -> None:
        if cfg.cache != "none" and not model.supports_cache:
            raise IncompatibleMethodError(
                f"cache={cfg.cache!r} needs a model that can recompute some canvas columns against cached K/V "
                f"(the zoo's MDLM architecture); {model.name!r} ({type(model.model).__name__}) cannot. "
                f"Run {method} with cache='none'."
            )
        self.model, self.mode, self.mask_id = model, cfg.cache, model.mask_token_id
        default = {"delayed": DELAYED_REFRESH, "window": window.REFRESH}.get(cfg.cache, 0)
        self.every = cfg.cache_refresh or default
        self.active, self.window = cfg.active_tokens, cfg.window_tokens
        self.base: torch.Tensor | None = None  # [B, T] window: the canvas at each row's last full forward
        self.recap, self.warmup = cfg.recap, cfg.recap_warmup  # ReCAP's schedule, in place of the above
        if self.recap is not None:
            self.every = self.recap + 1
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # per layer [B, KVH, T, D]
        device = model.device
        self.ref_block = torch.full((rows,), -1, dtype=torch.long, device=device)  # block at the last refresh
        self.ref_step = torch.zeros(rows, dtype=torch.long, device=device)
        self.has_cache = torch.zeros(rows, dtype=torch.bool, device=device)
        self.cached: torch.Tensor | None = None  # [B, T] delayed: K/V stored for the column's current token
        self._pending: list[tuple[torch.Tensor, list, torch.Tensor | None, bool]] = []
        self._last: tuple[torch.Tensor, ...] = ()
        self._j = torch.arange(0, device=device)  # `_arange`'s kept range

    def __call__(
        self,
        x: torch.Tensor,  # [R, T] canvases
        attention: torch.Tensor,  # [R, T]
        rows: torch.Tensor,  # [R] batch row of each entry
        lo: torch.Tensor,  # [R] canvas column of each view's start
        hi: torch.Tensor,  # [R] one past its end
        block: torch.Tensor,  # [R] block id of each view
        step: torch.Tensor | int,  # [R] step number of each entry, or one int for all (read only by a cache)
        width: int | None = None,  # max(hi - lo) if the host knows it (`View.width`); None reads it from the device
    ) -> torch.Tensor:
        """-> `[R, W, V]` logits of columns lo + j (j < W = max(hi - lo)); past a row's view, its last column again.

        The output head runs only on those columns, and a cached forward recomputes each needed column once.
        """
        W = int((hi - lo).max()) if width is None else width
        cols = torch.minimum(lo[:, None] + self._arange(W, x.device), (hi - 1)[:, None])  # [R, W]
        if self.mode == "none":
            return self.model.forward(x, attention, at=cols)
        if isinstance(step, int):
            step = torch.full_like(rows, step)
        self._fit(x.shape[1])
        refresh = ~self.has_cache[rows]
        if self.recap is not None:
            refresh |= recap_refresh(step, self.ref_step[rows], self.recap, self.warmup)
        else:
            if self.mode in ("prefix", "dual", "suffix"):
                refresh |= block != self.ref_block[rows]
            if self.every:
                refresh |= step - self.ref_step[rows] >= self.every
        out: torch.Tensor | None = None
        self._pending, self._last = [], (x, rows, block, step)
        for full in (True, False):
            g = (refresh if full else ~refresh).nonzero().squeeze(-1)
            if g.numel() == 0:
                continue
            if full:
                part, kv = self.model.forward_columns(x[g], attention[g], None, None, at=cols[g])
                q = None
            else:
                att = attention[g]
                if self.mode == "window":
                    q, att = self._window(x[g], att, rows[g], lo[g], hi[g])
                else:
                    q = self._columns(x[g], att, rows[g], lo[g], hi[g])  # [G, Q]
                r = rows[g]
                assert self.kv is not None  # rows that are not refreshed have a cache
                stored = self.kv if _all_rows(r, len(self.has_cache)) else [(k[r], v[r]) for k, v in self.kv]
                part, kv = self.model.forward_columns(x[g], att, q, stored, at=cols[g])
            if len(g) == len(rows):  # one group: nothing to merge
                out = part
            else:
                out = part.new_zeros((x.shape[0], *part.shape[1:])) if out is None else out
                out[g] = part
            self._pending.append((g, kv, q, full))
        assert out is not None  # every row is in one of the two groups
        return out

    def _arange(self, n: int, device: torch.device) -> torch.Tensor:
        """`arange(n)`, cut from one kept across calls (made again only when a longer one is needed)."""
        if self._j.numel() < n or self._j.device != device:
            self._j = torch.arange(max(n, self._j.numel()), device=device)
        return self._j[:n]

    def grow(self, rows: torch.Tensor) -> None:
        """`rows` `[R]` have grown: their appended masks have no K/V yet, so their next forward is a full one."""
        self.has_cache[rows] = False

    @torch.inference_mode()
    def _fit(self, T: int) -> None:
        """Fit the cache to canvases of T columns. End-of-Text Prediction drops the columns after an EOS from later
        forwards: the cache is cut. A growing canvas appends columns: the cache is widened with zeros, read by no
        row (a row that did not grow hides them; one that grew was marked by `grow` and refreshes)."""
        if self.kv is None or self.kv[0][0].shape[2] == T:
            return
        if self.kv[0][0].shape[2] < T:
            self.kv = [(_widen(k, T, 2), _widen(v, T, 2)) for k, v in self.kv]
            self.cached = None if self.cached is None else _widen(self.cached, T, 1)
            self.base = None if self.base is None else _widen(self.base, T, 1, self.mask_id)
            return
        self.kv = [(k[:, :, :T].contiguous(), v[:, :, :T].contiguous()) for k, v in self.kv]
        if self.cached is not None:
            self.cached = self.cached[:, :T].contiguous()
        if self.base is not None:
            self.base = self.base[:, :T].contiguous()

    @torch.inference_mode()  # the stored K/V are the model's inference tensors, updated in place here
    def keep(self, entries: torch.Tensor | None = None) -> None:
        """Store the last call's K/V for `entries` (default: all; at most one entry per row)."""
        if self.mode == "none":
            return
        x, rows, block, step = self._last
        chosen = torch.ones(len(rows), dtype=torch.bool, device=rows.device)
        if entries is not None:
            chosen = torch.zeros_like(chosen).index_fill_(0, entries, True)
        B = len(self.has_cache)
        for g, kv, q, full in self._pending:
            sel = chosen[g]
            if not sel.any():
                continue
            e, r = g[sel], rows[g[sel]]
            if bool(sel.all()) and _all_rows(r, B):  # every row, in order: the fresh K/V become the cache
                self.kv = list(kv)  # (the model wrote them into new tensors; nothing else holds them)
            else:
                if self.kv is None:
                    self.kv = [(k.new_zeros((B, *k.shape[1:])), v.new_zeros((B, *v.shape[1:]))) for k, v in kv]
                for (K, V), (k, v) in zip(self.kv, kv, strict=True):
                    K[r], V[r] = k[sel], v[sel]
            if full:
                self.has_cache[r], self.ref_block[r], self.ref_step[r] = True, block[e], step[e]
                if self.mode == "window":
                    if self.base is None:
                        self.base = torch.zeros(B, x.shape[1], dtype=x.dtype, device=x.device)
                    self.base[r] = x[e]
            if self.mode != "delayed":
                continue
            if self.cached is None:
                self.cached = torch.zeros(B, x.shape[1], dtype=torch.bool, device=x.device)
            if full:
                self.cached[r] = x[e] != self.mask_id
            else:
                assert q is not None  # a partial forward recomputed the columns q
                fresh = torch.zeros_like(x[e], dtype=torch.bool).scatter_(1, q[sel], True)
                self.cached[r] |= fresh & (x[e] != self.mask_id)

    def _window(self, x: torch.Tensor, attention: torch.Tensor, rows: torch.Tensor, lo: torch.Tensor,
                hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Window-Diffusion's cheap step (window.py): `[G, Q]` the view, the active masks and the tokens committed
        since the last full forward, and the attention with the far field hidden."""
        assert self.base is not None  # rows with a cache were computed by a full forward first
        need, attention = window.window_plan(x, self.base[rows], attention, self.mask_id, hi, self.active,
                                             self.window)
        cols = torch.arange(x.shape[1], device=x.device)
        need |= (cols[None, :] >= lo[:, None]) & (cols[None, :] < hi[:, None])
        Q = int(need.sum(-1).max())
        order = need.long().argsort(dim=-1, descending=True, stable=True)[:, :Q]  # needed columns first
        n = need.sum(-1, keepdim=True)
        return torch.where(torch.arange(Q, device=x.device) < n, order, order[:, :1]), attention

    def _columns(self, x: torch.Tensor, attention: torch.Tensor, rows: torch.Tensor, lo: torch.Tensor,
                 hi: torch.Tensor) -> torch.Tensor:
        """`[G, Q]` the columns a cached forward recomputes, padded per row by repeating one of its own."""
        T = x.shape[1]
        if self.mode == "delayed":
            assert self.cached is not None  # rows with a cache were committed by a full forward first
            need = ~self.cached[rows] & attention.bool()  # masks and tokens committed since the last forward
            need |= x == self.mask_id
            Q = int(need.sum(-1).max())
            order = need.long().argsort(dim=-1, descending=True, stable=True)[:, :Q]  # needed columns first
            n = need.sum(-1, keepdim=True)
            return torch.where(torch.arange(Q, device=x.device) < n, order, order[:, :1])
        start = torch.zeros_like(lo) if self.mode == "suffix" else lo
        end = torch.full_like(hi, T) if self.mode == "prefix" else hi
        Q = int((end - start).max())
        return torch.minimum(start[:, None] + torch.arange(Q, device=x.device), (end - 1)[:, None])


def _widen(t: torch.Tensor, T: int, dim: int, fill: int = 0) -> torch.Tensor:
    """`t` padded with `fill` along `dim` to length T."""
    shape = list(t.shape)
    shape[dim] = T - shape[dim]
    return torch.cat([t, t.new_full(shape, fill)], dim=dim)


def _all_rows(rows: torch.Tensor, B: int) -> bool:
    """Whether `rows` is 0..B-1 in order (then the cache can be used and replaced without copies)."""
    return len(rows) == B and bool((rows == torch.arange(B, device=rows.device)).all())
