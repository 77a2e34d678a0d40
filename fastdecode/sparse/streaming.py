"""sparse.streaming: StreamingLLM (Xiao et al. 2024): the first `sinks` tokens and a window of the most recent
ones, `budget` columns in all, in every layer (`dense_layers=0`, as the authors evict in every layer); nothing else
is read, so nothing else need be kept.

Positions (`positions`): the authors cache keys before RoPE and rotate them at their slot in the rolling cache
(sinks at 0..sinks-1, the window after them), the query at the slot after the cached keys
(`streaming_llm/pos_shift/modify_llama.py`), so no query-key distance ever exceeds the cache size: that is what lets
StreamingLLM run past the model's trained length. `positions="shift"` (the default, the authors' mode) does the same
at each decode step: fastdecode caches keys after RoPE, and RoPE is a rotation, so each gathered key at position p
is rotated on by (slot - p) and the query by (its slot - its position) (`attention.gathered`, `Rotation`). The
window keeps its distances to the query and the sinks move next to the window, so a decode step rotates only the sinks
(`slot_shifts`). `positions="original"` reads the same columns at their positions in the text (sliding-window
attention with sinks), for models whose RoPE cannot be re-rotated this way.

`StreamingConfig` / `StreamingSelector` are the sinks-and-window part shared with DuoAttention's streaming heads
(`duo.py`), at original positions."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ..attention import Plan, Rotation, register_rule, rotate
from ..config import check
from ..errors import IncompatibleMethodError
from .base import Selection, Selector, SparseConfig


@dataclass(frozen=True)
class StreamingConfig(SparseConfig):
    """The window is `budget - sinks` tokens (`recent` is ignored: the whole budget is the window)."""

    def check_window(self) -> None:
        check(self.sinks < self.budget, "budget", self.budget,
              f"must exceed the sinks ({self.sinks}): the rest of the budget is the recent window")


class StreamingSelector(Selector):
    """Sinks and a recent window at the keys' own positions (DuoAttention's streaming heads)."""

    def window(self) -> int:
        return self.cfg.budget - self.cfg.sinks

    def always(self, visible: torch.Tensor) -> torch.Tensor:
        rank = visible.long().cumsum(-1)
        total = rank[:, -1:]
        recent = max(self.window(), self._queries)
        return visible & ((rank <= self.cfg.sinks) | (rank > total - recent))

    def choose(self, layer, q, k, mask, visible) -> Selection:
        none = torch.full((k.shape[0], k.shape[1], k.shape[2]), float("-inf"), device=k.device)
        return Selection(self.top(none, visible, self.cfg.budget + self._queries))

    def held_columns(self, context: int, heads: int, layers: int) -> float:
        dense = min(self.cfg.dense_layers, layers)
        return float(heads * (dense * context + (layers - dense) * min(context, self.cfg.budget)))


@dataclass(frozen=True)
class StreamingLLMConfig(StreamingConfig):
    """StreamingLLM's parameters: no dense layers, positions within the cache (see the module docstring)."""

    dense_layers: int = 0
    positions: Literal["shift", "original"] = "shift"  # "shift": keys at their slot in the cache (the authors')


class StreamingLLMSelector(StreamingSelector):
    cfg: StreamingLLMConfig

    def __post_init__(self) -> None:
        super().__post_init__()
        self._freq: torch.Tensor | None = None
        self._plan: Plan | None = None
        if self.model is not None and self.cfg.positions == "shift":  # refused before any step
            self._freq = rotary_frequencies(self.model)

    def begin(self, cache: Any, plan: Plan) -> None:
        super().begin(cache, plan)
        self._plan = plan  # the key and query positions the shift starts from

    def choose(self, layer, q, k, mask, visible) -> Selection:
        # every layer of one mask (the plan builds one per sliding window) reads the same columns at the same slots:
        # chosen once per forward
        key = f"selection:{id(mask)}"
        if key not in self.state:
            self.state[key] = self._choose(layer, q, k, mask, visible)
        return self.state[key]

    def _choose(self, layer, q, k, mask, visible) -> Selection:
        sel = super().choose(layer, q, k, mask, visible)
        if self.cfg.positions == "shift":
            if self._freq is None or self._plan is None:
                raise RuntimeError("positions='shift' needs the model's rotary frequencies: make the rule with "
                                   "its model (make_selector(text, model))")
            sel.cols, sel.rotation = slot_shifts(sel.cols, self._plan.k_pos, self._plan.q_pos, self._freq)
        return sel


def slot_shifts(cols: torch.Tensor, k_pos: torch.Tensor, q_pos: torch.Tensor,
                inv_freq: torch.Tensor) -> tuple[torch.Tensor, Rotation]:
    """The columns `cols` `[B, H, n]` (-1 = none), reordered, and the rotation that moves them to their slots: the
    selected columns in position order take slots 0, 1, ...; a query takes the slot after the selected columns
    before it (its own column's slot). `k_pos` `[B, K]`, `q_pos` `[B, Q]` are the plan's positions.

    Where the queries of a row and head share one shift (a decode step always), only shifts relative to it matter:
    the columns that move relative to the query (the sinks, once the window has left them behind) come first and are
    the only ones rotated; the window and the query stay as cached."""
    B, H, n = cols.shape
    none = cols < 0
    pos = k_pos.gather(1, cols.clamp(min=0).flatten(1)).view(B, H, n)
    pos = pos.masked_fill(none, torch.iinfo(pos.dtype).max)  # unused entries sort last
    order = pos.argsort(-1)
    slot = torch.empty_like(order).scatter_(-1, order, torch.arange(n, device=cols.device).expand(B, H, n))
    ordered = pos.gather(-1, order).contiguous()  # [B, H, n]
    queries = q_pos[:, None, :].expand(B, H, q_pos.shape[1]).contiguous()  # [B, H, Q]
    q_shift = torch.searchsorted(ordered, queries) - queries  # [B, H, Q]: slot - position of each query
    k_shift = (slot - pos).masked_fill(none, 0)  # [B, H, n]
    if not bool((q_shift == q_shift[..., :1]).all()):
        return cols, Rotation(inv_freq, k_shift, q_shift)
    rel = (k_shift - q_shift[..., :1]).masked_fill(none, 0)  # [B, H, n] shift relative to the query's
    first = (rel == 0).to(torch.int8).argsort(dim=-1, stable=True)  # the columns that move first
    cols, rel = cols.gather(-1, first), rel.gather(-1, first)
    moving = int((rel != 0).sum(-1).max())
    return cols, Rotation(inv_freq, rel[..., :moving])


def rotary_frequencies(model: Any) -> torch.Tensor:
    """The model's rotary `inv_freq` `[D/2]`, after checking that rotating a cached key by d positions equals
    computing it at its position + d (one rotary embedding, static frequencies, half-split layout over the whole
    head): otherwise positions='shift' is refused, with the fix."""
    net = model.model
    fix = "use positions='original' (the window and sinks at their own positions), or dense attention"
    found = {id(m): m for m in net.modules() if isinstance(getattr(m, "inv_freq", None), torch.Tensor)}
    name = getattr(model, "name", type(net).__name__)
    if len(found) != 1:
        raise IncompatibleMethodError(
            f"StreamingLLM's position shift re-rotates cached keys at one set of rotary frequencies, but {name!r} "
            f"has {len(found)} rotary embeddings: {fix}.")
    rotary = next(iter(found.values()))
    inv_freq = rotary.inv_freq.detach().float()
    kind = getattr(rotary, "rope_type", "default")
    heads = int(model.config.num_attention_heads)
    head_dim = int(getattr(model.config, "head_dim", None) or model.config.hidden_size // heads)
    apply = getattr(sys.modules.get(type(rotary).__module__), "apply_rotary_pos_emb", None)
    if kind in ("dynamic", "longrope") or apply is None or 2 * inv_freq.numel() != head_dim \
            or not _rerotates(rotary, apply, inv_freq):
        raise IncompatibleMethodError(
            f"StreamingLLM's position shift rotates cached keys on by a few positions, which {name!r}'s rotary "
            f"embedding ({kind}, {2 * inv_freq.numel()} of {head_dim} channels) does not allow: {fix}.")
    return inv_freq


def _rerotates(rotary: Any, apply: Any, inv_freq: torch.Tensor) -> bool:
    """Whether the model's own `apply_rotary_pos_emb` at p + d equals `rotate` by d of it at p (a few positions)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 1, 3, 2 * inv_freq.numel(), generator=g).to(inv_freq.device)
    p = torch.tensor([[0, 5, 17]], device=inv_freq.device)
    d = torch.tensor([[3, 11, -9]], device=inv_freq.device)
    try:
        with torch.no_grad():
            at_p = apply(x, x, *rotary(x, p))[1]
            at_pd = apply(x, x, *rotary(x, p + d))[1]
    except (TypeError, ValueError, RuntimeError):
        return False
    return bool(torch.allclose(rotate(at_p, d[:, None], inv_freq), at_pd, atol=1e-4, rtol=1e-4))


register_rule(
    "streaming", StreamingLLMSelector, StreamingLLMConfig,
    description="StreamingLLM: attention sinks plus a recent window of `budget` tokens in all, in every layer.",
)
