"""Model-free draft sources: pure functions over a `[N]` token context."""

from __future__ import annotations

import torch


def continuation(context: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Up to k tokens that followed the leftmost earlier occurrence of the context's trailing n-gram.

    Only occurrences followed by at least one token count, so the trailing n-gram never matches itself.
    Example: context [5 6 7 5 6], n=2, k=3 -> the 2-gram [5 6] occurs at 0, followed by [7 5 6] -> [7 5 6].
    Returns an empty tensor when there is no such occurrence.
    """
    N = context.numel()
    if n < 1 or k < 1 or N <= n:
        return context[:0]
    windows = context[: N - 1].unfold(0, n, 1)  # [N - n, n]: every n-gram that ends before the last token
    hits = (windows == context[N - n :]).all(-1).nonzero()
    if hits.numel() == 0:
        return context[:0]
    start = int(hits[0]) + n
    return context[start : start + k].clone()


def longest_match(context: torch.Tensor, min_n: int, max_n: int, k: int) -> torch.Tensor:
    """Continuation of the longest trailing n-gram (max_n down to min_n) found earlier; the leftmost wins ties."""
    for n in range(max_n, min_n - 1, -1):
        found = continuation(context, n, k)
        if found.numel():
            return found
    return context[:0]
