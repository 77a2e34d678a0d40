"""ReCAP's refresh schedule (Liu et al. 2025, "Plug-and-Play Context Feature Reuse for Efficient Masked
Generation", liebenxj/ReCAP `cache_decoding.py`) over the diffusion caches: `recap=k` (with `recap_warmup=w`).

ReCAP interleaves full evaluations with cheap ones that reuse the context's features from the last full one and
recompute only the positions being decoded: after `pre_full_iters` full steps, each full step is followed by
`num_cache_iters` cheap ones (1 in all the authors' runs, with 0 or 8-12 warm-up steps of 16-32). Here the cheap
step is the cache's own partial forward (`dual`: the view; `suffix`: the prompt, the decoded prefix and the view;
`prefix`: the view and what follows; `delayed`: what is not cached yet), and the schedule replaces the cache's own
refreshes (at block changes, every `cache_refresh` steps): the first `recap_warmup` steps of a row are full, then
one in every k + 1. A block change therefore no longer forces a full forward, which is where the dual cache
spends most of its forwards on `dlm.threshold` (a block takes two or three).

What ReCAP recomputes in a cheap step is narrower: the positions that the full step ranked to be decoded in the
group; a threshold rule does not know them in advance, so the view stands in for them.
"""

from __future__ import annotations

import torch


def recap_refresh(step: torch.Tensor, ref_step: torch.Tensor, cheap: int, warmup: int) -> torch.Tensor:
    """`[R]` step numbers and the steps of the rows' last full forward -> `[R]` bool: this step is full (a
    warm-up step, or `cheap` cheap steps have run since the last full one)."""
    return (step < warmup) | (step - ref_step > cheap)
