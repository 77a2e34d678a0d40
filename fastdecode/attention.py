"""The one attention function every causal forward of fastdecode passes through.

It is registered with transformers' attention interface (and, with an empty mask builder, its mask interface: a
name missing there would get no mask at all) under the name `fastdecode`. Instead of the mask transformers builds
from the cache length, it reads the current forward's `Plan`: which stored key each query may see (padding,
causality, token trees, side tokens), the logical position of every query and key, and applies each layer's
sliding window from those positions. So tree masks, sliding windows (per layer type, as Gemma mixes them) and
sparse selection are one mechanism, and the cache may store keys at columns other than their positions.

Sparse attention enters here too, as a contract and a table, so that a driver or a method config needs only this
core module: `SparseSelector` is what a forward needs of a rule (`CausalLM.forward(..., sparse=selector)`), and the
rule table (`register_rule`, `make_selector`, `check_attention`, `rules`) turns an `attention="quest:budget=128"`
parameter into a selector. The rules themselves live in `fastdecode/sparse/`, loaded on demand (`plugins.load`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import plugins
from .config import MethodConfig, build_config
from .errors import ParameterError, close_names

NAME = "fastdecode"

# Which SDPA kernels a CUDA forward may use, in torch's order of preference. Left to itself, torch may dispatch
# bfloat16/float16 attention to cuDNN, which plans for every new sequence length (about 9 ms of host time per call
# on an H200: 86 % of a generation's CPU time, issue #30); flash and memory-efficient attention need no plan, and
# math is the fallback for shapes neither takes. None leaves the choice to torch. One switch: `use_sdpa_backends`.
SDPA_NAMES = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
              "math": SDPBackend.MATH, "cudnn": SDPBackend.CUDNN_ATTENTION}
DEFAULT_SDPA = "flash,efficient,math"
_sdpa_backends: list[SDPBackend] | None = [SDPA_NAMES[n] for n in DEFAULT_SDPA.split(",")]
_grouped = False  # `use_grouped_attention`: fastdecode's own dense attention instead of SDPA
DENSE = "dense"  # the `attention=` value of dense attention (no rule)

_PLAN: ContextVar[Plan | None] = ContextVar("fastdecode_attention_plan", default=None)


@dataclass
class Plan:
    """What the queries of one forward may attend to.

    `allow[b, i, j]`: query i of row b may see key column j (before any sliding window); `q_pos` / `k_pos` are the
    logical positions of the queries and of the key columns the cache returns. A query always sees itself, so padding
    queries attend to something and never produce NaNs that the cache would keep.
    """

    allow: torch.Tensor  # [B, Q, K] bool
    q_pos: torch.Tensor  # [B, Q] long
    k_pos: torch.Tensor  # [B, K] long
    # a sparse attention rule (its `begin` sets it): per layer, which columns each head reads; None = dense
    sparse: SparseSelector | None = None
    _masks: dict[int | None, torch.Tensor] = field(default_factory=dict)

    def mask(self, window: int | None) -> torch.Tensor:
        """`[B, 1, Q, K]` bool mask of a layer with this sliding window (None: full attention); built once."""
        key = window if window and window > 0 else None
        if key not in self._masks:
            allow = self.allow
            if key is not None:
                # transformers' rule: key j is inside the window of query i when pos_i - pos_j < window
                allow = allow & ((self.q_pos[:, :, None] - self.k_pos[:, None, :]) < key)
            self._masks[key] = allow[:, None]
        return self._masks[key]


@dataclass
class Rotation:
    """Rotary (RoPE) position shifts applied by `gathered` before it attends: the first `keys.shape[-1]`
    selected columns (`Selection.cols[..., :m]`) are rotated on by `keys` positions, the others stay, and each query by
    `queries` (None: the queries stay), at the model's rotary frequencies `inv_freq`. Cached keys are stored already
    rotated at their own position, and RoPE is a rotation, so rotating by (new - old) puts them at a new position
    (StreamingLLM's positions within the cache) without the unrotated keys. Only relative shifts matter (q.k depends
    on the difference of the two rotations), so a rule may rotate a few keys by their shift relative to the query's
    instead of every key and the query."""

    inv_freq: torch.Tensor  # [D/2] float: the angle of one position step per channel pair (half-split layout)
    keys: torch.Tensor  # [B, Hkv, m] long: shifts of the first m selected columns (m <= n)
    queries: torch.Tensor | None = None  # [B, Hkv, Q] long: shift of each query, per key/value head
    # cos and sin of the shifts, computed at the first layer that uses them and reused by the others
    _turns: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, repr=False)

    def turn(self, which: str, x: torch.Tensor) -> torch.Tensor:
        """`x` `[B, H, n, D]` rotated on by the `which` ("keys" or "queries") shifts, repeated over query groups."""
        if which not in self._turns:
            shift = getattr(self, which)
            angle = shift.to(torch.float32)[..., None] * self.inv_freq.to(x.device, torch.float32)  # [B, Hkv, n, D/2]
            self._turns[which] = angle.cos(), angle.sin()
        cos, sin = self._turns[which]
        g = x.shape[1] // cos.shape[1]
        if g > 1:
            cos, sin = cos.repeat_interleave(g, dim=1), sin.repeat_interleave(g, dim=1)
        return turned(x, cos, sin)


@dataclass
class Selection:
    """Columns each head reads: `cols[b, h, i]` (-1 = nothing), per key/value head (`[B, Hkv, n]`: the query heads
    of a group share them) or per query head (`[B, Hq, n]`); `dense[h]`: key/value head h attends to all;
    `rotation`: re-rotate the gathered keys and the queries first (None: every key stays at its own position)."""

    cols: torch.Tensor  # [B, Hkv, n] or [B, Hq, n] long
    dense: torch.Tensor | None = None  # [Hkv] bool
    rotation: Rotation | None = None


class SparseSelector(Protocol):
    """What a forward needs of a sparse attention rule (`fastdecode.sparse.base.Selector` is the base of every rule).

    The adapter calls `begin(cache, plan)` once per forward, after the cache has placed the new keys (the selector
    sets `plan.sparse` to itself); the attention function then calls `select` in every layer before it attends.
    """

    def begin(self, cache: Any, plan: Plan) -> None:
        """A forward over `cache` (fastdecode's `KVCache`) starts; `plan` is its attention plan."""

    def select(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor) -> Selection | None:
        """`q` `[B, Hq, Q, D]`, `k`/`v` `[B, Hkv, K, D]`, `mask` `[B, 1, Q, K]` bool: the columns to read, or None
        (attend densely)."""


@contextlib.contextmanager
def planned(plan: Plan) -> Iterator[None]:
    """Make `plan` the mask of every attention call inside the block (one model forward)."""
    token = _PLAN.set(plan)
    try:
        yield
    finally:
        _PLAN.reset(token)


def attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, Hq, Q, D]
    key: torch.Tensor,  # [B, Hkv, K, D]
    value: torch.Tensor,  # [B, Hkv, K, Dv]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature; returns `[B, Q, Hq, Dv]` and no weights."""
    plan = _PLAN.get()
    if plan is None:
        # a forward outside fastdecode's adapter (e.g. transformers' own generate on the same module): plain causal
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      sliding_window=sliding_window, **kwargs)
    mask = plan.mask(sliding_window)  # [B, 1, Q, K]
    if mask.shape[-1] != key.shape[-2] or mask.shape[-2] != query.shape[-2]:
        raise RuntimeError(
            f"attention plan covers {tuple(mask.shape[-2:])} (queries, keys) but the layer has "
            f"({query.shape[-2]}, {key.shape[-2]}): the cache and the plan disagree"
        )
    if plan.sparse is not None and softcap is None and s_aux is None:
        selection = plan.sparse.select(getattr(module, "layer_idx", 0), query, key, value, mask)
        if selection is not None:
            scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
            out = gathered(query, key, value, mask, scale, selection.cols, selection.dense, selection.rotation)
            return out.transpose(1, 2).contiguous(), None
    if _grouped and softcap is None and s_aux is None:
        scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
        return grouped(query, key, value, mask, scale).transpose(1, 2).contiguous(), None
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: each key/value head serves `groups` query heads
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    if softcap is None and s_aux is None:
        out = sdpa(query, key, value, mask, scale)
    else:
        out = _eager(query, key, value, mask, scale, softcap, s_aux)
    return out.transpose(1, 2).contiguous(), None


def grouped(
    q: torch.Tensor,  # [B, Hq, Q, D]
    k: torch.Tensor,  # [B, Hkv, K, D]
    v: torch.Tensor,  # [B, Hkv, K, Dv]
    mask: torch.Tensor,  # [B, 1, Q, K] bool
    scale: float,
) -> torch.Tensor:
    """Dense attention in float32 as a few large operations: the query heads of each key/value head stacked into one
    matrix (no copy of the keys and values per query head), scores, masked softmax and the weighted values in float32,
    the result in the queries' dtype. `[B, Hq, Q, Dv]`.

    Why (issue #30): in exact mode every forward attends over the cache's whole storage (2048 columns then) with a
    boolean mask, which on CUDA leaves SDPA the memory-efficient kernel: one thread block per head and 64 queries,
    walking the columns one tile after another. On an H200 that kernel took 42 % of a 1.1B decode step's device time
    (111 us a layer for 32 queries; `docs/results/gpu/2026-11-27/kernels-graphs.txt`) while the keys and values it reads
    take about 1 us. Here the work spreads over the whole GPU, and the 32x-repeated keys and values are never written.
    A row whose mask is all False gets a uniform average instead of NaN."""
    B, Hq, Q, D = q.shape
    Hkv, K = k.shape[1], k.shape[2]
    g = Hq // Hkv
    qg = q.reshape(B, Hkv, g * Q, D).to(torch.float32) * scale  # query head h serves key/value head h // g
    scores = torch.matmul(qg, k.to(torch.float32).transpose(-1, -2))  # [B, Hkv, g * Q, K]
    scores = scores.view(B, Hkv, g, Q, K).masked_fill(~mask[:, :, None], torch.finfo(torch.float32).min)
    probs = scores.softmax(-1).view(B, Hkv, g * Q, K)
    out = torch.matmul(probs, v.to(torch.float32))  # [B, Hkv, g * Q, Dv]
    return out.view(B, Hq, Q, -1).to(q.dtype)


def use_grouped_attention(on: bool) -> None:
    """The switch for `grouped`: on, every dense attention of fastdecode's plan-driven forwards (no soft-capping, no
    sinks, no sparse rule) runs it instead of SDPA, on every device; off (the default), SDPA. Its rounding differs
    from SDPA's, so flip it between generations, never inside one (exact mode's identity holds within a setting)."""
    global _grouped
    _grouped = bool(on)


def grouped_attention_on() -> bool:
    return _grouped


def gathered(
    q: torch.Tensor,  # [B, Hq, Q, D]
    k: torch.Tensor,  # [B, Hkv, K, D]
    v: torch.Tensor,  # [B, Hkv, K, Dv]
    mask: torch.Tensor,  # [B, 1, Q, K] bool
    scale: float,
    cols: torch.Tensor,  # [B, Hkv, n] or [B, Hq, n] long: the columns each head reads, -1 = none
    dense: torch.Tensor | None = None,  # [Hkv] bool: key/value heads that read every column
    rotation: Rotation | None = None,  # move the gathered keys and the queries to other positions first
) -> torch.Tensor:
    """Attention that reads only `cols` of the cache: equal to dense attention with every other column masked.
    `cols` holds one set per key/value head (shared by its query heads) or one per query head (Quest, TidalDecode
    and Double Sparsity select per query head in their authors' code). With a `rotation` (StreamingLLM's position
    shift) only the gathered keys are rotated on, never the whole cache. Returns `[B, Hq, Q, Dv]`."""
    B, H, n = cols.shape
    Hq, Hkv = q.shape[1], k.shape[1]
    g = Hq // Hkv
    if H != Hkv and H != Hq:
        raise ValueError(f"a selection of {H} heads for {Hq} query and {Hkv} key/value heads: give one set of "
                         "columns per key/value head or per query head")
    if rotation is not None and H != Hkv:
        raise ValueError("a rotation moves one set of columns per key/value head, not per query head")
    Q, K = mask.shape[-2], mask.shape[-1]
    idx = cols.clamp(min=0)
    if H == Hkv:
        ks = k.gather(2, idx[..., None].expand(B, Hkv, n, k.shape[-1]))
        vs = v.gather(2, idx[..., None].expand(B, Hkv, n, v.shape[-1]))
    else:  # per query head: the g sets of a group are read from their key/value head in one gather
        flat = idx.reshape(B, Hkv, g * n, 1)
        ks = k.gather(2, flat.expand(B, Hkv, g * n, k.shape[-1])).reshape(B, Hq, n, k.shape[-1])
        vs = v.gather(2, flat.expand(B, Hkv, g * n, v.shape[-1])).reshape(B, Hq, n, v.shape[-1])
    m = mask.expand(B, H, Q, K).gather(3, idx[:, :, None, :].expand(B, H, Q, n)) & (cols >= 0)[:, :, None, :]
    qs = q
    if rotation is not None:
        turn = rotation.keys.shape[-1]  # the first `turn` columns move relative to the query
        if turn:
            ks[:, :, :turn] = rotation.turn("keys", ks[:, :, :turn])
        if rotation.queries is not None:
            qs = rotation.turn("queries", q)  # [B, Hq, Q, D]
    if g > 1 and H == Hkv:
        ks, vs, m = (t.repeat_interleave(g, dim=1) for t in (ks, vs, m))
    out = sdpa(qs, ks, vs, m, scale)
    if dense is not None and bool(dense.any()):
        heads = dense.repeat_interleave(g).nonzero().flatten()  # query heads of the dense key/value heads
        kv = dense.nonzero().flatten()
        kd, vd = k[:, kv], v[:, kv]
        if g > 1:
            kd, vd = kd.repeat_interleave(g, dim=1), vd.repeat_interleave(g, dim=1)
        out[:, heads] = sdpa(q[:, heads], kd, vd, mask, scale)
    return out


def rotate(x: torch.Tensor, shift: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """`x` `[..., n, D]` (already rotated, half-split layout as transformers' `rotate_half`) rotated on by `shift`
    `[..., n]` positions, in float32, returned in `x`'s dtype."""
    angle = shift.to(torch.float32)[..., None] * inv_freq.to(x.device, torch.float32)  # [..., n, D/2]
    return turned(x, angle.cos(), angle.sin())


def turned(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`x` `[..., D]` rotated by the angles whose cos and sin are given `[..., D/2]` (half-split pairs)."""
    x1, x2 = x.to(torch.float32).chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def use_sdpa_backends(names: str | None) -> None:
    """The switch: "flash,efficient,math" (the default), any subset in order of preference, or "torch" / None to
    let torch choose (cuDNN included). Applies to CUDA forwards; a CPU forward always lets torch choose."""
    global _sdpa_backends
    _sdpa_backends = parse_sdpa_backends(names)


def parse_sdpa_backends(names: str | None) -> list[SDPBackend] | None:
    if names is None or names.strip() in ("", "torch"):
        return None
    out = []
    for name in (n.strip() for n in names.split(",")):
        if name not in SDPA_NAMES:
            raise ParameterError(f"Unknown SDPA backend {name!r}. {close_names(name, list(SDPA_NAMES))} "
                                 f"(a list such as {DEFAULT_SDPA!r}, or 'torch' for torch's own choice).")
        out.append(SDPA_NAMES[name])
    return out


def sdpa_backends(device: torch.device) -> list[SDPBackend] | None:
    """The kernels an SDPA call on `device` may use (None: torch's choice)."""
    return _sdpa_backends if device.type == "cuda" else None


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
         scale: float | None = None) -> torch.Tensor:
    """`F.scaled_dot_product_attention` restricted to the chosen kernels on CUDA. `[B, Hq, Q, Dv]`."""
    chosen = sdpa_backends(q.device)
    if chosen is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    with sdpa_kernel(chosen, set_priority=True):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def _eager(q, k, v, mask, scale, softcap, s_aux) -> torch.Tensor:
    """Scores in full for what SDPA cannot do: logit soft-capping (Gemma 2) and attention sinks (GPT-OSS)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # [B, H, Q, K]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    if s_aux is not None:  # one learnt sink logit per head, in the softmax but with no value
        sink = s_aux.reshape(1, -1, 1, 1).expand(scores.shape[0], -1, scores.shape[2], 1).to(scores.dtype)
        probs = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
    else:
        probs = scores.softmax(-1)
    return torch.matmul(probs.to(v.dtype), v)


def _no_mask(*args: object, **kwargs: object) -> None:
    """The mask builder transformers calls for `fastdecode`: nothing, the plan is the mask."""
    return None


_registered = False


def register() -> str:
    """Register the attention function and its (empty) mask builder with transformers once; returns the name."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(NAME, attention)
        AttentionMaskInterface.register(NAME, _no_mask)
        _registered = True
    return NAME


# -- the rule table: `attention=` values -------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """A sparse attention rule: `selector(cfg, model=model)` makes one from its `config` (a `MethodConfig`)."""

    name: str
    selector: Callable[..., SparseSelector]
    config: type[MethodConfig]
    description: str = ""  # one line: what the rule keeps (the description of its method `sparse.<name>`)


RULES: dict[str, Rule] = {}
_WATCHERS: list[Callable[[Rule], None]] = []


def register_rule(name: str, selector: Callable[..., SparseSelector], config: type[MethodConfig], *,
                  description: str = "") -> Rule:
    """Make a rule usable as an `attention=` value; whoever watches the table (`on_rule`: the `sparse` family, which
    makes the method `sparse.<name>` of it) hears of it."""
    if name == DENSE:
        raise ValueError(f"{DENSE!r} is dense attention, not a rule name")
    if name in RULES:
        raise ValueError(f"attention rule {name!r} is registered twice")
    rule = RULES[name] = Rule(name, selector, config, description)
    for watcher in _WATCHERS:
        watcher(rule)
    return rule


def on_rule(watcher: Callable[[Rule], None]) -> None:
    """Call `watcher` with every rule registered so far and every rule registered later."""
    _WATCHERS.append(watcher)
    for rule in list(RULES.values()):
        watcher(rule)


def rules() -> list[str]:
    """Names of the registered rules (every `sparse.*` method's)."""
    plugins.load()
    return sorted(RULES)


def parse_attention(text: str) -> tuple[str, dict[str, str]]:
    """"quest:budget=128,page=16" -> ("quest", {"budget": "128", "page": "16"})."""
    name, _, rest = text.strip().partition(":")
    params: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ParameterError(
                f"Cannot read attention={text!r}: write the rule's parameters as name=value separated by commas, "
                "e.g. attention='quest:budget=128,page=16'."
            )
        params[key.strip()] = value.strip()
    return name.strip(), params


def is_dense(text: str | None) -> bool:
    """Whether an `attention` parameter value means dense attention (unset, empty, or "dense")."""
    return not text or parse_attention(str(text))[0] == DENSE


def check_attention(text: str) -> None:
    """Validate an `attention` parameter value (its rule and the rule's parameters)."""
    make_selector(text, None)


def make_selector(text: str, model: Any, **defaults: Any) -> SparseSelector | None:
    """The selector an `attention` parameter names (None for dense); `defaults` fill parameters not given. With a
    model, one that cannot run sparse attention is refused here (by the rule's selector), before any step."""
    plugins.load()
    name, params = parse_attention(text)
    if name == DENSE:
        if params:
            raise ParameterError(f"attention={text!r}: dense attention takes no parameters.")
        return None
    if name not in RULES:
        raise ParameterError(
            f"Unknown attention rule {name!r}. {close_names(name, [DENSE, *RULES])} "
            "(each sparse.* method's rule, or 'dense')."
        )
    rule = RULES[name]
    known = {f for f in rule.config.__dataclass_fields__}
    merged = {k: v for k, v in defaults.items() if k in known}
    merged.update(params)
    cfg = build_config(rule.config, merged, f"sparse.{name}")
    return rule.selector(cfg, model=model)
