"""Window-Diffusion as a cache (`cache="window"`; vhicrgit/Window-Diffusion `llada_window_diffusion.py`).

Window-Diffusion ranks the masks left to right. Between full forwards (one every `cache_refresh` steps, 32 by
default, the authors' `window_size`) a step recomputes only the *active* columns: the first `active_tokens`
masks (16 in the authors' demo) and every token committed since the last full forward (its K/V are still those of
a mask); the K/V of the rest of the *window* (the prompt, the decoded tokens and the first `window_tokens` masks,
64) are read from the cache, and the masks past the window, the far field, are pruned: no column attends to them.

Here the step's view is always recomputed too (its logits are what the policy reads), and the far field is the
run of masks at the canvas's tail past the window and the view: the zoo's model derives positions from the
attention mask, so a hidden column may only be followed by hidden columns. When decoding runs left to right (every
block method) that is the whole far field. Between refreshes the far field never reaches any logit (tested).
"""

from __future__ import annotations

import torch

REFRESH = 32  # the authors' window_size: a full forward every 32 steps
WINDOW_TOKENS = 64  # masks whose (cached) K/V the active columns attend to
ACTIVE_TOKENS = 16  # masks recomputed every step


def window_plan(
    x: torch.Tensor,  # [G, T] canvases
    base: torch.Tensor,  # [G, T] the canvases at their last full forward
    attention: torch.Tensor,  # [G, T]
    mask_id: int,
    hi: torch.Tensor,  # [G] canvas column one past each view
    active: int,
    window: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (`[G, T]` bool columns to recompute besides the view, `[G, T]` attention with the far field hidden)."""
    T = x.shape[1]
    masked = x == mask_id
    rank = masked.long().cumsum(-1) - 1  # [G, T] left-to-right rank of each mask
    need = (masked & (rank < active)) | ((x != base) & attention.bool())  # first masks, tokens committed since
    cols = torch.arange(T, device=x.device)
    last_token = torch.where(~masked & attention.bool(), cols, -1).max(-1).values  # [G] rightmost non-mask column
    nth = torch.where(masked & (rank == window), cols, T).min(-1).values  # [G] first mask past the window, or T
    start = torch.maximum(torch.maximum(nth, last_token + 1), hi)  # [G] the far field: the masked tail from here
    far = cols[None, :] >= start[:, None]
    return need & ~far, attention.masked_fill(far, 0)
