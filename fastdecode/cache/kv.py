"""KV caches of a causal LM.

`KVCache` is fastdecode's own: storage allocated once per generation (grown in chunks only if a run outgrows it),
one `[B, H, capacity, D]` tensor pair per layer, and per row a stored length apart from the logical positions of the
stored entries. A forward writes each row's new keys at that row's length (rows may hold different lengths: batched
speculative rows accept different counts); rolling back is moving a row's length back, no copies. The attention
plan (`fastdecode.attention.Plan`) built here says which stored column each query may see and at which position it
sits, so left padding, trees and sliding windows need no other mask.

`DynamicKVCache` wraps a `transformers` cache for the models the preallocated cache cannot serve (attention that
bypasses transformers' attention interface, recurrent or convolution state layers); it rolls back only plain
key/value layers and says so through `can_rollback()`.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, LinearAttentionCacheLayerMixin

from ..attention import Plan
from ..errors import IncompatibleMethodError
from .base import CacheBase
from .pool import _RETIRED, Key, Storage, StoragePool, free_retired_graphs, recycle, retire_graphs

__all__ = ["_RETIRED", "DynamicKVCache", "KVCache", "free_retired_graphs", "retire_graphs"]


class _Layer(CacheLayerMixin):
    """One attention layer's keys and values; the owning `KVCache` decides where a forward writes."""

    is_compileable = False
    is_croppable = True

    def __init__(self, owner: KVCache, sliding: bool) -> None:
        super().__init__()
        # a weak reference: the cache holds its layers, and a layer holding its cache back would make a cycle that
        # only the cyclic garbage collector frees (the cache's storage goes back to its pool when it dies)
        self._owner = weakref.ref(owner)
        self.is_sliding = sliding  # informational: the window itself is applied by the attention plan

    @property
    def owner(self) -> KVCache:
        owner = self._owner()
        assert owner is not None, "a KVCache layer outlived its cache"
        return owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        B, H, _, D = key_states.shape
        cap = self.owner.capacity
        self.keys = key_states.new_zeros(B, H, cap, D)
        self.values = value_states.new_zeros(B, value_states.shape[1], cap, value_states.shape[-1])
        self.device = key_states.device
        self.is_initialized = True
        self.owner.moved()

    def _grow(self, capacity: int) -> None:
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros(*old.shape[:2], capacity, old.shape[-1])
            new[:, :, : old.shape[2]] = old
            setattr(self, name, new)
        self.owner.moved()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        else:
            assert self.keys is not None  # initialised
            if self.keys.shape[2] < self.owner.capacity:
                self._grow(self.owner.capacity)
        assert self.keys is not None and self.values is not None
        o = self.owner
        T = key_states.shape[2]
        if o._start is not None:  # every row writes at the same column: a slice
            self.keys[:, :, o._start : o._start + T] = key_states
            self.values[:, :, o._start : o._start + T] = value_states
        else:  # ragged rows: each row's new keys go after its own stored entries
            assert o._write is not None  # set with the ragged rows' columns
            idx = o._write[:, None, :, None]  # [B, 1, T, 1]
            self.keys.scatter_(2, idx.expand_as(key_states), key_states)
            self.values.scatter_(2, idx.expand_as(value_states), value_states)
        return self.keys[:, :, : o._width], self.values[:, :, : o._width]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner._seen + query_length, 0

    def get_seq_length(self) -> int:
        return self.owner._seen

    def get_max_length(self) -> int:
        return -1

    def crop(self, tokens_to_remove: int) -> None:
        """Rows are rolled back by the owner (`KVCache.crop_rows`), which every layer reads its lengths from."""

    def reset(self) -> None:
        self.owner.crop(0)


class KVCache(CacheBase, Cache):
    """Preallocated key/value storage for `batch` rows, with per-row lengths; see the module docstring.

    `lengths[b]` is how many columns row b holds; `positions[b, j]` the logical position of column j (the model's
    position id of that token) and `valid[b, j]` whether it is a real token (left padding is not).
    """

    def __init__(self, layer_types: list[str], batch: int = 1, capacity: int = 0, chunk: int = 256,
                 device: torch.device | str = "cpu", full_width: bool = False, pool: StoragePool | None = None) -> None:
        super().__init__(layers=[_Layer(self, sliding=t == "sliding_attention") for t in layer_types])
        # every forward attends over the whole storage (exact mode, models/exact.py): one key length per generation
        self.full_width = full_width
        self.batch = batch
        self.chunk = chunk
        self.capacity = max(capacity, 0)
        self.lengths = [0] * batch
        self.positions = torch.zeros(batch, self.capacity, dtype=torch.long, device=device)  # [B, cap]
        self.valid = torch.zeros(batch, self.capacity, dtype=torch.bool, device=device)  # [B, cap]
        self._seen = 0  # what transformers' get_seq_length reports: the longest row before the current forward
        self._start: int | None = None
        self._write: torch.Tensor | None = None
        self._width = 0
        self._watchers: dict[int, int] = {}  # reader -> first column (re)written since it last asked
        # CUDA graphs of forwards over this cache (models/graphs.py), by (batch, width, key length); they read the
        # storage in place, so every reallocation of it bumps `storage_version`, which drops them. They live in the
        # storage bundle (cache/pool.py), which a dying cache hands to `pool` for the model's next cache
        self.storage_version = 0
        self._layer_types, self._device = tuple(layer_types), str(torch.device(device))
        self._pool = pool
        storage = self._take()
        if storage is not None:
            self._install(storage)
        self._own(storage)

    # -- the storage bundle (cache/pool.py) --------------------------------------------------------------------------
    def _pool_key(self) -> Key:
        return self.batch, self.capacity, self._layer_types, self.full_width, self._device

    def _take(self) -> Storage | None:
        """A dead cache's bundle of this cache's key from the pool, its positions and valid flags zeroed in place
        (the addresses the graphs read stay). Its keys and values past the new lengths stay too: no query is
        allowed to see a column before it is written again, and a masked column adds exact zeros."""
        storage = self._pool.take(self._pool_key()) if self._pool is not None else None
        if storage is not None:
            assert storage.positions is not None and storage.valid is not None
            with torch.inference_mode():  # (the kept tensors were made in a forward's inference mode)
                storage.positions.zero_()
                storage.valid.zero_()
        return storage

    def _install(self, storage: Storage) -> None:
        """Run on `storage`'s tensors."""
        assert storage.positions is not None and storage.valid is not None
        self.positions, self.valid = storage.positions, storage.valid
        for layer, keys, values in zip(self.layers, storage.keys, storage.values, strict=True):
            assert isinstance(layer, _Layer)
            layer.keys, layer.values, layer.device, layer.is_initialized = keys, values, keys.device, True

    def _own(self, storage: Storage | None) -> None:
        """`storage` (or a new empty bundle) is this cache's: its graphs are `graphs`, and when the cache dies the
        bundle goes back to the pool (or its graphs are retired, never destroyed). The callback holds the bundle,
        never the cache."""
        self._storage = storage if storage is not None else Storage()
        self.graphs: dict[tuple[Any, ...], Any] = self._storage.graphs
        self._finalizer = weakref.finalize(self, recycle, self._storage, self._pool)

    def _hand_back(self) -> None:
        """The cache no longer runs on its bundle's tensors: the bundle goes back to the pool now (if filled)."""
        self._finalizer.detach()
        recycle(self._storage, self._pool)

    def add_graph(self, key: tuple[Any, ...], graph: Any) -> None:
        """Keep a graph captured over the current storage (models/graphs.py); the bundle records that storage, so
        that the cache's successor can replay the graph."""
        self.graphs[key] = graph
        self._record()

    def _record(self) -> None:
        """The bundle records the current storage (all of it allocated at the capacity), for the cache's successor."""
        if self.storage_ready():
            layers = [layer for layer in self.layers if isinstance(layer, _Layer)]
            self._storage.fill(self._pool_key(), [layer.keys for layer in layers if layer.keys is not None],
                               [layer.values for layer in layers if layer.values is not None], self.positions,
                               self.valid)

    def release(self) -> None:
        """Hand the storage and its graphs to the pool now (not when the cache dies); the cache is empty afterwards
        and its next forward allocates new storage."""
        if self._write is not None:
            raise RuntimeError("a cache cannot release its storage during a forward")
        self._hand_back()
        for layer in self.layers:
            assert isinstance(layer, _Layer)
            layer.keys, layer.values, layer.is_initialized = None, None, False
        self.positions = torch.zeros(self.batch, self.capacity, dtype=torch.long, device=self._device)
        self.valid = torch.zeros(self.batch, self.capacity, dtype=torch.bool, device=self._device)
        self.lengths = [0] * self.batch
        self._seen = 0
        self.storage_version += 1
        self._own(None)

    def written_since(self, reader: int) -> int:
        """The first column written (or rewritten after a rollback) since `reader` last asked (0 the first time):
        what a sparse rule that summarises columns (Quest's page bounds) must summarise again."""
        first = self._watchers.get(reader, 0)
        self._watchers[reader] = min(self.lengths)
        return first

    # -- capabilities ------------------------------------------------------------------------------------------------
    def can_rollback(self) -> bool:
        """Every layer holds plain keys and values, so dropping the last entries of a row restores it exactly."""
        return True

    def ragged(self) -> bool:
        return True

    def plans_attention(self) -> bool:
        return True

    def graphable(self) -> bool:
        return self.full_width

    # -- lengths -----------------------------------------------------------------------------------------------------
    @property
    def lengths(self) -> list[int]:
        return self._lengths

    @lengths.setter
    def lengths(self, value: list[int]) -> None:
        self._lengths = value

    def crop_rows(self, lengths: list[int]) -> None:
        """Row b keeps its first `lengths[b]` columns: the rollback of speculative decoding, no copies."""
        if len(lengths) != self.batch or any(
            not 0 <= new <= old for new, old in zip(lengths, self.lengths, strict=True)
        ):
            raise ValueError(f"cannot crop rows holding {self.lengths} to {lengths}")
        self.lengths = list(lengths)
        self._seen = self.length

    def next_positions(self) -> list[int]:
        """Each row's next logical position: one past its last real stored token (0 for an empty row)."""
        out = []
        for b, n in enumerate(self.lengths):
            real = self.positions[b, :n][self.valid[b, :n]]
            out.append(int(real[-1]) + 1 if real.numel() else 0)
        return out

    @torch.inference_mode()  # the stored tensors are made in the forward's inference mode
    def resize(self, batch: int) -> None:
        """Keep the first `batch` rows (new rows are empty): a running batch that grows or drops its last rows. The
        storage of the old row count goes back to the pool, and the pool's storage of the new one (if it keeps one)
        takes the rows, so that a batch which shrinks and grows again replays graphs captured before."""
        if batch < 1 or self._write is not None:
            raise ValueError(f"cannot resize a cache to {batch} rows" + (" during a forward" if batch >= 1 else ""))
        keep = min(batch, self.batch)
        ready = self.storage_ready()
        old_layers = [(layer.keys, layer.values) for layer in self.layers if isinstance(layer, _Layer)]
        old_positions, old_valid = self.positions, self.valid
        self.batch = batch  # (the pool's key)
        storage = self._take() if ready else None  # (a bundle of the new key: never this cache's own, which is live)

        def fit(old: torch.Tensor, into: torch.Tensor | None) -> torch.Tensor:
            new = old.new_zeros(batch, *old.shape[1:]) if into is None else into
            new[:keep] = old[:keep]
            return new

        for i, layer in enumerate(self.layers):
            assert isinstance(layer, _Layer)
            keys, values = old_layers[i]
            if keys is not None and values is not None:
                layer.keys = fit(keys, storage.keys[i] if storage else None)
                layer.values = fit(values, storage.values[i] if storage else None)
        self.positions = fit(old_positions, storage.positions if storage else None)
        self.valid = fit(old_valid, storage.valid if storage else None)
        self.storage_version += 1
        self._hand_back()  # the old row count's tensors and graphs, for a later cache or resize
        self._own(storage)
        self._record()
        self.lengths = self.lengths[:keep] + [0] * (batch - keep)
        self.batch = batch
        self._seen = self.length

    @torch.inference_mode()  # the stored tensors are made in the forward's inference mode
    def adopt(self, slot: int, other: CacheBase, row: int) -> None:
        """Row `slot` takes over row `row` of `other` (a cache of the same model): its keys, values, positions and
        valid flags, copied; what `slot` held before is dropped. How a row prefilled on its own joins a running
        batch (`ar.driver.ARSession`)."""
        if self._write is not None:
            raise RuntimeError("a row cannot join the cache during a forward")
        if not isinstance(other, KVCache):
            raise TypeError(f"a KVCache row adopts a row of another KVCache, not of {type(other).__name__}")
        n = other.lengths[row]
        self._reserve(n)
        self.positions[slot, :n] = other.positions[row, :n].to(self.positions.device)
        self.valid[slot, :n] = other.valid[row, :n].to(self.valid.device)
        self.valid[slot, n:] = False
        for mine, theirs in zip(self.layers, other.layers, strict=True):
            assert isinstance(mine, _Layer) and isinstance(theirs, _Layer)
            if not theirs.is_initialized:
                continue
            assert theirs.keys is not None and theirs.values is not None
            if not mine.is_initialized:
                k, v = theirs.keys, theirs.values
                mine.lazy_initialization(k.new_zeros(self.batch, *k.shape[1:]), v.new_zeros(self.batch, *v.shape[1:]))
            assert mine.keys is not None and mine.values is not None
            if mine.keys.shape[2] < self.capacity:
                mine._grow(self.capacity)
            mine.keys[slot, :, :n] = theirs.keys[row, :, :n]
            mine.values[slot, :, :n] = theirs.values[row, :, :n]
        self.lengths[slot] = n
        self._seen = self.length

    def _reserve(self, width: int) -> None:
        if width <= self.capacity:
            return
        capacity = -(-width // self.chunk) * self.chunk
        grow = capacity - self.capacity
        self.positions = torch.cat([self.positions, self.positions.new_zeros(self.batch, grow)], dim=1)
        self.valid = torch.cat([self.valid, self.valid.new_zeros(self.batch, grow)], dim=1)
        self.capacity = capacity  # layers grow on their next update
        self.moved()

    # -- one forward -------------------------------------------------------------------------------------------------
    def begin(
        self,
        positions: torch.Tensor,  # [B, T] logical positions of the new tokens
        visible: torch.Tensor,  # [B, T, T] bool: new token i may see new token j
        real: torch.Tensor,  # [B, T] bool: False for padding tokens (seen by nobody but themselves)
        past: torch.Tensor | None = None,  # [B, T, C] bool: which stored columns each new token may see (default all)
    ) -> Plan:
        """Place the next forward's `T` tokens after each row's entries and return the attention plan.

        Each row's lengths advance by T; roll back what the caller does not keep with `crop_rows`.
        """
        B, T = positions.shape
        base = self.advance(B, T)
        device = self.positions.device
        starts = torch.tensor(base, dtype=torch.long, device=device)
        positions = positions.to(device)
        allow, cols = self.place(starts, positions, visible.to(device), real.to(device),
                                 None if past is None else past.to(device))
        self._start = base[0] if all(n == base[0] for n in base) else None
        self._write = cols
        return Plan(allow=allow, q_pos=positions, k_pos=self.positions[:, : self._width])

    def advance(self, B: int, T: int) -> list[int]:
        """The host half of `begin`: room for `T` more columns per row, the key width of the forward, each row's
        lengths advanced by T; returns the lengths before (the rows' first new columns). No tensor is touched unless
        the storage grows, so a captured forward (models/graphs.py) can do the device half (`place`) itself."""
        if B != self.batch:
            raise ValueError(f"a cache built for {self.batch} rows got a forward over {B}")
        base = self.lengths
        width = max(base) + T
        self._reserve(width)
        self._width = self.capacity if self.full_width else width
        self._seen = max(base)
        for reader, first in self._watchers.items():
            self._watchers[reader] = min(first, min(base))
        self.lengths = [n + T for n in base]
        return base

    def place(
        self,
        starts: torch.Tensor,  # [B] long: each row's first new column (its length before the forward)
        positions: torch.Tensor,  # [B, T] long
        visible: torch.Tensor,  # [B, T, T] bool
        real: torch.Tensor,  # [B, T] bool
        past: torch.Tensor | None,  # [B, T, C] bool, C <= the forward's key width
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The device half of `begin` (after `advance`): the new tokens' positions and real flags stored at their
        columns, and the attention plan's `allow` `[B, T, K]` with those columns `[B, T]`. Only device operations
        on fixed shapes, so a CUDA graph can capture it."""
        B, T = positions.shape
        width = self._width
        device = self.positions.device
        cols = starts[:, None] + torch.arange(T, device=device)  # [B, T]
        self.positions.scatter_(1, cols, positions)
        self.valid.scatter_(1, cols, real)
        k = torch.arange(width, device=device)
        stored = self.valid[:, :width] & (k[None] < starts[:, None])  # [B, K] stored real tokens
        eye = torch.eye(T, dtype=torch.bool, device=device)
        new = (visible & real[:, None, :]) | eye  # [B, T, T]
        allow = stored[:, None, :].expand(B, T, width).clone()  # [B, T, K]
        if past is not None:  # e.g. a draft tree whose earlier levels are stored: a node sees only its ancestors
            C = past.shape[-1]
            allow[:, :, :C] &= past
        allow.scatter_(2, cols[:, None, :].expand(B, T, T), new)
        return allow, cols

    def end(self) -> None:
        """The forward is over: transformers' length queries see the new entries."""
        self._seen = self.length
        self._start, self._write = None, None

    # -- what a captured forward needs (models/graphs.py) -------------------------------------------------------------
    def moved(self) -> None:
        """The storage was reallocated: graphs that read the old addresses are retired (`retire_graphs`)."""
        self.storage_version += 1
        self._storage.clear()  # (the bundle no longer describes the storage: never pooled with stale graphs)

    def ready_for(self, T: int) -> bool:
        """Room for `T` more columns per row (grown now if needed) and the storage allocated at that capacity: a
        forward of T tokens reallocates nothing, so a captured one can run."""
        self._reserve(max(self.lengths) + T)
        return self.storage_ready()

    @property
    def key_width(self) -> int:
        """The key columns the current forward attends over (set by `advance`)."""
        return self._width

    def storage_ready(self) -> bool:
        """Every layer's storage is allocated at the cache's capacity: a forward reallocates nothing."""
        return all(
            isinstance(layer, _Layer) and layer.is_initialized and layer.keys is not None
            and layer.keys.shape[2] == self.capacity for layer in self.layers
        )

    @contextlib.contextmanager
    def scattered(self, write: torch.Tensor) -> Iterator[None]:
        """Inside the block the layers scatter the new keys to the columns `write` `[B, T]` (a captured forward's
        static buffer) instead of the current forward's own, even where every row starts at one column."""
        saved = self._start, self._write
        self._start, self._write = None, write
        try:
            yield
        finally:
            self._start, self._write = saved


class DynamicKVCache(CacheBase):
    """A `transformers` cache for models the preallocated cache cannot serve; grows by concatenation. Its rows all
    hold one length (not `ragged`), and the model's own masks place its tokens (no attention plan)."""

    def __init__(self, hf_cache: Any) -> None:
        self.hf = hf_cache

    @property
    def length(self) -> int:
        return int(self.hf.get_seq_length())

    @property
    def lengths(self) -> list[int]:
        """One length for every row (transformers' cache has no per-row lengths), as `KVCache.lengths` reads."""
        return [self.length]

    def crop_rows(self, lengths: list[int]) -> None:
        """`KVCache.crop_rows` for a cache whose rows all hold one length."""
        if len(set(lengths)) != 1:
            raise ValueError(f"transformers' cache keeps one length for every row, not {lengths}")
        self.crop(lengths[0])

    def can_rollback(self) -> bool:
        layers = getattr(self.hf, "layers", None)
        if layers is None:
            return False
        # a layer with a recurrent state (Mamba blocks, FalconH1's hybrid layers, which also hold keys) cannot go back
        return all(
            not getattr(layer, "is_sliding", False) and hasattr(layer, "keys")
            and not isinstance(layer, LinearAttentionCacheLayerMixin)
            for layer in layers
        )

    def trim(self, n: int) -> None:
        """Remove the last `n` cached positions (0 <= n <= length)."""
        if n and not self.can_rollback():  # first: a cache of state layers only has no length to check n against
            raise IncompatibleMethodError(
                f"This model's cache ({type(self.hf).__name__}) cannot roll back; "
                "use a method that does not need trimming."
            )
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot trim {n} positions from a cache of length {self.length}")
        if n == 0:
            return
        for layer in self.hf.layers:
            if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                continue
            layer.keys = layer.keys[..., : layer.keys.shape[-2] - n, :]
            layer.values = layer.values[..., : layer.values.shape[-2] - n, :]

    def crop(self, length: int) -> None:
        """Keep only the first `length` positions."""
        self.trim(self.length - length)
