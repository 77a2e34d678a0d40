"""Shared by the statistical tests: draw counts, processors, the chi-square test, exact next-token marginals."""

from __future__ import annotations

import torch

from fastdecode.speculative.verify import target_distribution

N = 800  # draws per test: identical prompts in one batch, rows draw one after another from one generator
PROCESSORS = dict(temperature=1.0, top_k=16)


def chi_square_p_value(samples: list[int], p: torch.Tensor) -> float:
    """Pearson's test of samples against `[V]` probabilities; cells expecting < 5 draws are pooled."""
    p = p.cpu()
    counts = torch.bincount(torch.tensor(samples), minlength=p.numel()).double()
    assert counts[p == 0].sum() == 0, "drew a token the target gives probability 0"
    expected = len(samples) * p.double()
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2))  # chi2 survival


def next_distribution(model, ids: torch.Tensor) -> torch.Tensor:
    """`[B, L]` prompts (same length) -> `[B, V]` processed next-token distributions, on the CPU (where the draws
    are counted), whatever device the model is on."""
    ids = ids.to(model.device)
    L = ids.shape[1]
    logits = model.forward(ids, torch.arange(L, device=ids.device).expand_as(ids))[:, -1]
    return target_distribution(logits, PROCESSORS["temperature"], PROCESSORS["top_k"]).cpu()


def token_marginals(model, prompt: list[int], depth: int) -> list[torch.Tensor]:
    """Exact `[V]` distributions of the first `depth` generated tokens, each given that no earlier one is an end of
    text: every continuation in the processors' support, weighted by its probability, one batched forward a level."""
    eos = sorted(model.eos_token_ids)
    contexts, weights = torch.tensor([prompt]), torch.ones(1, dtype=torch.float64)
    out = []
    for level in range(depth):
        p = next_distribution(model, contexts).double()  # [C, V]
        out.append((weights[:, None] * p).sum(0).float())
        if level + 1 < depth:
            p[:, eos] = 0
            rows, tokens = p.nonzero(as_tuple=True)
            weights = weights[rows] * p[rows, tokens]
            weights, contexts = weights / weights.sum(), torch.cat([contexts[rows], tokens[:, None]], 1)
    return out


def first_two(outputs: list[list[int]]) -> tuple[list[int], list[int]]:
    """First tokens of every output; second tokens of those that did not stop at EOS."""
    return [o[0] for o in outputs], [o[1] for o in outputs if len(o) > 1]
