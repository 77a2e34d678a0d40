"""The contract every KV cache of a causal LM keeps: what drivers may ask of a cache instead of its class.

Two caches implement it: `KVCache` (fastdecode's preallocated storage, one length per row, attention placed by a
`Plan`) and `DynamicKVCache` (a wrapped `transformers` cache, one length for every row). A driver asks the cache what
it can do (`can_rollback`, `ragged`, `plans_attention`) and never tests which class it holds: a cache added later
(paged, quantised, offloaded) only answers these questions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ..attention import Plan


class CacheBase(ABC):
    """Lengths, rollback and the rows of a batch; the capabilities say which of them a cache supports."""

    # -- lengths -----------------------------------------------------------------------------------------------------
    @property
    @abstractmethod
    def lengths(self) -> list[int]:
        """Stored entries of each row (one value per row, equal for every row where the cache is not `ragged`)."""

    @property
    def length(self) -> int:
        """Stored entries of the longest row."""
        return max(self.lengths)

    # -- capabilities ------------------------------------------------------------------------------------------------
    @abstractmethod
    def can_rollback(self) -> bool:
        """Whether dropping the last entries restores the cache exactly (speculative decoding needs it)."""

    def ragged(self) -> bool:
        """Whether rows keep lengths of their own: rows are cropped one by one, and a row may leave its slot or take
        a row prefilled elsewhere (`adopt`) while the others run on, as continuous batching needs."""
        return False

    def plans_attention(self) -> bool:
        """Whether the cache places each forward's tokens itself and builds its attention plan (`begin`/`end`), which
        tree masks, ragged rows and sparse attention rules need; otherwise the model's own masks are used."""
        return False

    def graphable(self) -> bool:
        """Whether a forward over the cache can be a captured CUDA graph (models/graphs.py): every forward attends
        over the whole storage at fixed addresses (exact mode's cache), and the cache offers `graphs`,
        `add_graph`, `storage_version`, `ready_for`, `advance`, `key_width`, `place` and `scattered`."""
        return False

    # -- rollback ----------------------------------------------------------------------------------------------------
    @abstractmethod
    def crop_rows(self, lengths: list[int]) -> None:
        """Row b keeps its first `lengths[b]` entries (every value equal where the cache is not `ragged`)."""

    def crop(self, length: int) -> None:
        """Keep at most the first `length` entries of every row."""
        self.crop_rows([min(length, n) for n in self.lengths])

    def trim(self, n: int) -> None:
        """Drop the last `n` entries of every row."""
        if not 0 <= n <= min(self.lengths):
            raise ValueError(f"cannot trim {n} positions from a cache whose rows hold {self.lengths}")
        self.crop_rows([length - n for length in self.lengths])

    # -- one forward (only where `plans_attention()`) ------------------------------------------------------------------
    def begin(self, positions: torch.Tensor, visible: torch.Tensor, real: torch.Tensor,
              past: torch.Tensor | None = None) -> Plan:
        """Place the next forward's tokens after each row's entries and return its attention plan."""
        raise NotImplementedError(f"{type(self).__name__} does not plan attention: the model's own masks place its "
                                  "tokens (ask `plans_attention()` first)")

    def end(self) -> None:
        """The forward that `begin` placed is over."""
        raise NotImplementedError(f"{type(self).__name__} does not plan attention (ask `plans_attention()` first)")

    # -- the rows of a running batch (only where `ragged()`) -----------------------------------------------------------
    def resize(self, batch: int) -> None:
        """Keep the first `batch` rows; new rows are empty."""
        raise NotImplementedError(f"{type(self).__name__} keeps one length for all rows: its rows cannot be resized "
                                  "(ask `ragged()` first)")

    def adopt(self, slot: int, other: CacheBase, row: int) -> None:
        """Row `slot` takes over row `row` of `other`, a cache of the same model and class."""
        raise NotImplementedError(f"{type(self).__name__} keeps one length for all rows: a row cannot join it "
                                  "(ask `ragged()` first)")
