"""Log-probabilities of a row's tokens under the target model, for `logprobs`, `echo` and vLLM's `prompt_logprobs`.

One more forward over prompt + output through the adapter's own forward path (the distribution before temperature,
top-p or penalties), run on the engine thread that owns the model. With `echo` the prompt's tokens are scored too
(lm-eval's loglikelihood requests); the first prompt token has no logprob (nothing predicts it), as in vLLM.
"""

from __future__ import annotations

import torch

from ..models.causal import CausalLM

# (token, its log-probability or None, the top-k alternatives as (token, logprob), its rank or None)
Entry = tuple[int, float | None, list[tuple[int, float]], int | None]


def token_logprobs(model: CausalLM, prompt: list[int], tokens: list[int], k: int, echo: bool = False) -> list[Entry]:
    """One entry per output token (and per prompt token first, with `echo`)."""
    ids = prompt + tokens
    start = 0 if echo else len(prompt) - 1  # the position whose logits predict the first token scored
    if len(ids) - 1 <= start:
        return [(prompt[0], None, [], None)] if echo and prompt else []
    batch = torch.tensor([ids], device=model.device)  # [1, T]
    positions = torch.arange(batch.shape[1], device=model.device)[None]  # [1, T]
    logits = model.forward(batch, positions)[0, start : len(ids) - 1]  # [S, V]: row s predicts ids[start + s + 1]
    lp = torch.log_softmax(logits, dim=-1)  # [S, V]
    targets = torch.tensor(ids[start + 1 :], device=lp.device)  # [S]
    chosen = lp.gather(1, targets[:, None])  # [S, 1]
    ranks = ((lp > chosen).sum(-1) + 1).tolist()
    top_v, top_i = lp.topk(k, dim=-1) if k else (lp[:, :0], lp[:, :0].long())  # [S, k]
    entries: list[Entry] = [(prompt[0], None, [], None)] if echo else []
    for t, c, i, v, r in zip(ids[start + 1 :], chosen[:, 0].tolist(), top_i.tolist(), top_v.tolist(), ranks,
                             strict=True):
        entries.append((t, c, list(zip(i, v, strict=True)), r))
    return entries
