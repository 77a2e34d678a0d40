"""What every sparse attention rule shares: the selection hook, the always-kept tokens, budgets, accounting.

A `Selector` (the core's `attention.SparseSelector`) is handed to `CausalLM.forward(..., sparse=selector)`. The
adapter calls `begin(cache, plan)` once per forward; fastdecode's attention function (`fastdecode.attention`) then
calls `select(layer, q, k, v, mask)` in every layer before it attends. `select` returns `None` (attend densely) or a
`Selection`: for each row and key/value head (or, with `per_query_head`, each query head) the cache columns to read
(`-1` = none), and optionally heads that stay dense. The attention function gathers only those columns
(`fastdecode.attention.gathered`), so a decode step reads `budget` columns per head instead of the whole cache.

Guards every rule gets from here:
- the first `sinks` and the last `recent` visible columns of each row are always kept (at least the forward's own
  queries: `recent` is raised to the number of queries);
- a row whose visible columns fit in the budget attends densely, so a budget >= the context is dense decoding,
  bit for bit;
- the first `dense_layers` layers are dense (the default of Quest, TidalDecode and Double Sparsity);
- the prefill (a forward of more than `max_queries` queries) is dense.

`per_query_head` (every top-k rule: quest, tidal, double, oracle, snapkv) chooses one set of columns per query head
instead of one per key/value head shared by its group. Where heads are not grouped the two are the same; with
grouped heads a key/value head then reads the union of its query heads' sets (what `Reads` counts), up to `g` times
the budget, as the authors' code does (it repeats the keys per query head before it scores them).

The selector also counts what a step reads (`Reads`): key and value columns per layer and head, including what the
rule itself reads to choose (Quest's page bounds, the oracle's full keys, Double Sparsity's label channels).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..attention import Plan, Selection
from ..config import MethodConfig, check
from ..models.capabilities import check_sparse_attention
from ..sampling.config import SamplingConfig


@dataclass(frozen=True)
class SparseConfig(SamplingConfig):
    """ar.greedy / ar.sample's parameters (temperature 0 = greedy) plus the token budget of the sparse layers."""

    temperature: float = 0.0
    budget: int = 256  # key/value columns each head reads in a sparse layer (sinks and recent included)
    sinks: int = 4  # first tokens always kept (StreamingLLM's attention sinks)
    recent: int = 32  # last tokens always kept (the query's own and its neighbours)
    dense_layers: int = 2  # the first layers attend densely
    max_queries: int = 16  # forwards of more queries (the prefill) attend densely
    per_query_head: bool = False  # top-k rules: one set of columns per query head, not per key/value head
    # whether the rule ranks columns per head, so that `per_query_head` means something (the top-k rules set it)
    TOP_K: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.TOP_K or not self.per_query_head, "per_query_head", self.per_query_head,
              "applies to the rules that rank columns per head (quest, tidal, double, oracle, snapkv); this rule "
              "reads the same columns in every head of a group: leave per_query_head off")
        check(self.budget >= 1, "budget", self.budget, "must be >= 1 token")
        check(self.sinks >= 0, "sinks", self.sinks, "must be >= 0")
        check(self.recent >= 1, "recent", self.recent, "must be >= 1 (the query's own token)")
        self.check_window()
        check(self.dense_layers >= 0, "dense_layers", self.dense_layers, "must be >= 0")
        check(self.max_queries >= 1, "max_queries", self.max_queries, "must be >= 1")

    def check_window(self) -> None:
        check(self.sinks + self.recent <= self.budget, "budget", self.budget,
              f"must hold the sinks and the recent window (sinks + recent = {self.sinks + self.recent}); "
              "raise budget or lower sinks / recent")


@dataclass
class Reads:
    """Key and value columns read (summed over layers, heads and rows) and the forwards they were read in."""

    key_cols: float = 0.0
    value_cols: float = 0.0
    dense_cols: float = 0.0  # what dense attention would have read (keys + values) in the same forwards
    forwards: int = 0

    def add(self, keys: float, values: float, dense: float) -> None:
        self.key_cols += keys
        self.value_cols += values
        self.dense_cols += dense


@dataclass
class Selector:
    """Base of every rule: `choose` is the rule (override it); the rest is shared."""

    cfg: SparseConfig
    reads: Reads = field(default_factory=Reads)
    model: Any = None  # the CausalLM adapter, for rules that read calibration
    _cache: Any = None
    _dirty: int = 0  # columns from here on were (re)written since this selector last looked
    _queries: int = 0
    state: dict[str, Any] = field(default_factory=dict)  # per-forward state shared across layers (TidalDecode)
    state_static: dict[str, Any] = field(default_factory=dict)  # kept for the whole run (calibrated head sets)

    def __post_init__(self) -> None:
        if self.model is not None:  # refused when the rule is made, before any step
            check_sparse_attention(self.model)

    # -- called by the adapter and the attention function -------------------------------------------------------
    def begin(self, cache: Any, plan: Plan) -> None:
        if self._cache is not cache:
            self._cache = cache
            self.reset()
        self._dirty = cache.written_since(id(self))
        self._queries = int(plan.q_pos.shape[1])
        self.state = {}
        self.reads.forwards += 1
        plan.sparse = self

    def reset(self) -> None:
        """A new cache: forget what was summarised of the old one."""

    def select(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor) -> Selection | None:
        """`q` `[B, Hq, Q, D]`, `k`/`v` `[B, Hkv, K, D]`, `mask` `[B, 1, Q, K]` bool (the plan's)."""
        self.observe(layer, q, k, mask)
        B, Hkv, K, _ = k.shape
        dense_cols = 2.0 * B * Hkv * K
        visible = mask[:, 0].any(1)  # [B, K] columns some query of the row may see
        if (q.shape[2] > self.cfg.max_queries or layer < self.cfg.dense_layers
                or int(visible.sum(-1).max()) <= self.cfg.budget):
            self.reads.add(dense_cols / 2, dense_cols / 2, dense_cols)
            return None
        sel = self.choose(layer, q, k, mask, visible)
        if sel is None:
            self.reads.add(dense_cols / 2, dense_cols / 2, dense_cols)
            return None
        n_dense = int(sel.dense.sum()) if sel.dense is not None else 0
        sparse_cols = kv_columns(sel.cols, Hkv, K) * (Hkv - n_dense) / Hkv
        dense_part = B * n_dense * K
        self.reads.add(sparse_cols + dense_part, sparse_cols + dense_part, dense_cols)
        return sel

    # -- the rule ----------------------------------------------------------------------------------------------
    def observe(self, layer: int, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> None:
        """Every forward, every layer (prefill included): keep summaries of new columns (Quest's page bounds)."""

    def choose(self, layer: int, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor,
               visible: torch.Tensor) -> Selection | None:
        raise NotImplementedError

    # -- helpers for rules -------------------------------------------------------------------------------------
    def always(self, visible: torch.Tensor) -> torch.Tensor:
        """`[B, K]` bool: the first `sinks` and last `recent` (at least the forward's queries) visible columns."""
        rank = visible.long().cumsum(-1)  # 1-based rank among the row's visible columns
        total = rank[:, -1:]
        recent = max(self.cfg.recent, self._queries)
        return visible & ((rank <= self.cfg.sinks) | (rank > total - recent))

    def top(self, scores: torch.Tensor, visible: torch.Tensor, budget: int | None = None) -> torch.Tensor:
        """`[B, H, n]` columns: the always-kept ones, then the best `scores` (`[B, H, K]`) up to the budget."""
        budget = budget or self.cfg.budget
        keep = self.always(visible)
        s = scores.float().masked_fill(~visible[:, None], float("-inf")).masked_fill(keep[:, None], float("inf"))
        n = min(budget, s.shape[-1])
        val, idx = s.topk(n, dim=-1, sorted=False)
        return idx.masked_fill(val == float("-inf"), -1)

    def real_columns(self, k: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """`[B, K]` bool: the real tokens each row stores (no left padding, nothing past a ragged row's end), from
        the cache; without one that says (a stand-in in a test), the columns the forward's last query sees."""
        valid, lengths = getattr(self._cache, "valid", None), getattr(self._cache, "lengths", None)
        K = k.shape[2]
        if valid is None or lengths is None or valid.shape[1] < K:
            return mask[:, 0, -1]
        ends = torch.tensor(lengths, device=valid.device)[:, None]  # [B, 1]
        return (valid[:, :K] & (torch.arange(K, device=valid.device)[None] < ends)).to(k.device)

    def add_reads(self, key_cols: float) -> None:
        """What a rule reads to choose, in key columns (e.g. the oracle reads every key)."""
        self.reads.key_cols += key_cols

    def held_columns(self, context: int, heads: int, layers: int) -> float:
        """Key/value columns (per row, over all layers and heads) the rule must keep: all, unless it evicts."""
        return float(context * heads * layers)


def query_scores(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, per_query_head: bool = False) -> torch.Tensor:
    """Attention weights (softmax of the 1/sqrt(d)-scaled logits, as the layer computes them) summed over queries and
    grouped query heads: `[B, Hkv, K]` (0 where unseen); with `per_query_head`, summed over queries only:
    `[B, Hq, K]`."""
    B, Hkv = k.shape[:2]
    g = q.shape[1] // Hkv
    qg = q.reshape(B, Hkv, g * q.shape[2], q.shape[3])  # [B, Hkv, g*Q, D]
    s = torch.matmul(qg, k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # [B, Hkv, g*Q, K]
    allow = mask[:, :, None].expand(-1, 1, g, -1, -1).reshape(B, 1, g * q.shape[2], -1)
    # softmax per query, then the probability mass a column gets from the queries (of the group)
    p = s.masked_fill(~allow, float("-inf")).softmax(-1).nan_to_num(0.0)  # [B, Hkv, g*Q, K]
    return group_sum(p, q.shape[2], per_query_head)


def group_sum(p: torch.Tensor, queries: int, per_query_head: bool) -> torch.Tensor:
    """`[B, Hkv, g*Q, K]` scores (query heads of a group, then queries) summed over the queries and, unless
    `per_query_head`, over the group: `[B, Hq, K]` or `[B, Hkv, K]`."""
    B, Hkv, gQ, K = p.shape
    if not per_query_head:
        return p.sum(2)
    return p.reshape(B, Hkv, gQ // queries, queries, K).sum(3).reshape(B, -1, K)


def kv_columns(cols: torch.Tensor, Hkv: int, K: int) -> float:
    """Key/value columns a selection reads (summed over rows and key/value heads): per query head, a key/value head
    reads the union of its query heads' columns."""
    B, H, n = cols.shape
    if H == Hkv:
        return float((cols >= 0).sum())
    hit = torch.zeros(B, Hkv, K + 1, dtype=torch.bool, device=cols.device)  # slot 0: "none"
    hit.scatter_(2, (cols + 1).clamp(min=0).reshape(B, Hkv, -1), True)
    return float(hit[..., 1:].sum())


__all__ = ["MethodConfig", "Reads", "Selection", "Selector", "SparseConfig", "group_sum", "kv_columns",
           "query_scores"]
