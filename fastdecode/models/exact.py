"""Exact mode: every cached forward of a causal LM has the same shapes, so a row's logits do not depend on how many
tokens share the forward.

In float32 a one-token decode step and a k-token verification give logits equal to within ~1e-6, and greedy paths
agree. In bfloat16 (the default on CUDA) the two take different kernels and reduction orders (attention picks its
kernel and its split of the keys from the query and key lengths; a GEMM its tiling from the row count), and the
rounding differences, ~1e-2 in the logits, flip near-ties: a lossless speculative method then leaves `ar.greedy`'s
path (measured in docs/gpu.md). Exact mode removes the shape from the arithmetic:

- every forward over a `KVCache` runs exactly `width` query tokens: a shorter block is padded (padding tokens are
  seen by nobody and are dropped from the cache afterwards), a longer one (a prefill) runs as consecutive chunks of
  `width` from the start of the row, so a prompt is always cut at the same places;
- every forward attends over the cache's whole storage (`KVCache(full_width=True)`), whose capacity is rounded up to
  `block` columns, so the key length is the same in every forward of a generation (columns not visible are masked);
  every driver asks for the same capacity for a request (its prompt, `max_new_tokens` and `MARGIN`), so a lossless
  method and its baseline run at one key length too;
- the logits of all `width` positions are computed (the LM head's shape is fixed too) and sliced afterwards.

A decode step and a verification are then the same computation on different inputs, with every row of a block
computed by the same kernel in the same order, so a lossless method equals its baseline token for token as long as
the kernels are deterministic (CUDA's default GEMM and flash attention are; cuBLAS workspaces and atomics-based
split-K are not used at these shapes, which the device check in docs/gpu.md confirms or refutes). The cost is the
padding: a decode step computes `width` tokens instead of one (nearly free on a GPU, where a step is launch- and
bandwidth-bound; about `width` times the matmul work on a CPU) and attention reads the whole storage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ParameterError
from .base import on_host

DEFAULT_WIDTH = 32  # query tokens per forward: the largest verification block of the default methods fits
DEFAULT_BLOCK = 256  # key columns are a multiple of this: runs of nearby lengths share one key length (a graph)
# columns past prompt + max_new_tokens that every driver asks its cache for (a speculative step stores its block
# before the budget cuts it): `ar.greedy`'s cache and a speculative method's then have one capacity, so one key length
MARGIN = 64


@dataclass(frozen=True)
class Exact:
    """The shapes every cached forward runs at: `width` query tokens over a multiple of `block` key columns."""

    width: int = DEFAULT_WIDTH
    block: int = DEFAULT_BLOCK

    def __post_init__(self) -> None:
        if self.width < 1 or self.block < self.width:
            raise ParameterError(f"exact mode needs 1 <= width <= block, not width={self.width}, block={self.block}: "
                                 f"e.g. exact={DEFAULT_WIDTH}.")

    def capacity(self, asked: int) -> int:
        """The storage of a cache asked for `asked` columns: room for one padded block more, rounded up to `block`."""
        need = max(asked, 1) + self.width
        return -(-need // self.block) * self.block


def exact_mode(value: bool | int | Exact | None, device: torch.device, dtype: torch.dtype) -> Exact | None:
    """What `load(exact=...)` means: None picks the default (on for CUDA in bfloat16/float16, where kernels differ by
    shape enough to flip greedy tokens; off elsewhere), False is off, True the default width, an int that width."""
    if isinstance(value, Exact):
        return value
    if value is None:
        value = device.type == "cuda" and dtype in (torch.bfloat16, torch.float16)
    if value is False:
        return None
    if value is True:
        return Exact()
    if isinstance(value, int) and not isinstance(value, bool):
        return Exact(width=value)
    raise ParameterError(f"exact={value!r}: pass True, False, None (the default for the device) or a block width.")


def pad_block(
    exact: Exact,
    ids: torch.Tensor,  # [B, T] with T <= width
    positions: torch.Tensor,  # [B, T]
    real: torch.Tensor,  # [B, T] bool
    visible: torch.Tensor,  # [B, T, T] bool
    past: torch.Tensor | None,  # [B, T, C] bool
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The block padded to `width` tokens: padding is not real, sees only itself and sits at the last position."""
    B, T = ids.shape
    W = exact.width
    if T == W:
        return ids, positions, real, visible, past
    out_ids = ids.new_full((B, W), pad_id)
    out_ids[:, :T] = ids
    out_pos = positions[:, -1:].expand(B, W).clone()
    out_pos[:, :T] = positions
    out_real = real.new_zeros(B, W)
    out_real[:, :T] = real
    out_vis = visible.new_zeros(B, W, W)
    out_vis[:, :T, :T] = visible
    out_past = None
    if past is not None:
        out_past = past.new_zeros(B, W, past.shape[-1])
        out_past[:, :T] = past
    return out_ids, out_pos, out_real, out_vis, out_past


def chunk_past(
    lengths: list[int],  # each row's stored columns before the whole block
    start: int,  # the chunk's first token within the block
    end: int,
    visible: torch.Tensor,  # [B, T, T] bool over the whole block
    past: torch.Tensor | None,  # [B, T, C] bool over the columns stored before the block
) -> torch.Tensor | None:
    """Which stored columns the tokens `start:end` of a block cut into chunks may see, once the earlier chunks are
    stored at each row's `lengths[b] + [0, start)`: what `past` said of the older columns, and `visible` of the
    earlier chunks. None when that is every stored column (a causal block with no `past`)."""
    B = visible.shape[0]
    # (no earlier chunk: no device round trip; a block built on a device, a tree left there, is not looked at: that
    # would read it, and the columns built below say the same of a causal block)
    causal = start == 0 or (on_host(visible.device) and bool(visible[:, start:end, :start].all()))
    if past is None and causal:
        return None
    C = max(max(lengths) + start, past.shape[-1] if past is not None else 0)
    out = torch.ones(B, end - start, C, dtype=torch.bool, device=visible.device)
    for b, n in enumerate(lengths):
        if past is not None:
            out[b, :, : past.shape[-1]] = past[b, start:end]
        out[b, :, n : n + start] = visible[b, start:end, :start]
    return out
