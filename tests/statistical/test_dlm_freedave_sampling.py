"""dlm.freedave at temperature > 0 samples from dlm.baseline's distribution at one token per step: chi-square tests
of whole outputs over many seeded runs, FreeDave against the baseline and both against the exact law.

`Table` is a tiny masked-diffusion LM that predicts only EOS and two tokens a, b, with strongly context-dependent
logits: each generated position adds a random table row for the token (or mask) at every other generated position.
Outputs of 4 tokens then take 31 values (a/b strings, cut at the first EOS), ten of them above 1% and none above
30%, and committing tokens from a stale draw would visibly move the law. The exact law of the baseline follows by
enumerating its Markov chain: from a canvas, every masked position of the view draws x0 ~ softmax(logits / T), and
the most confident one (p(x0) under softmax(logits), lowest offset on ties) is committed.

The power tests run the same checks on the baseline at another temperature, and on a FreeDave that keeps every
draft of a round unverified: both fail them by far.
"""

from __future__ import annotations

import itertools
from collections import Counter
from functools import lru_cache
from types import SimpleNamespace

import pytest
import torch
from sampling_stats import chi_square_p_value
from torch import nn

import fastdecode
from fastdecode.diffusion.policies import freedave
from fastdecode.models.diffusion import MaskedDiffusionLM

MASK, EOS = 3, 1
TOKENS = (EOS, 5, 6)  # all the model ever predicts
PROMPT = [0, 5, 6, 5]
N = 4  # generated tokens: one block of 4 (FreeDave drafts up to 4 steps) or two blocks of 2
SEEDS, ROWS = 40, 50  # 2000 draws per sampler: 40 seeded runs of a 50-row batch


class Table(nn.Module):
    """Logits over TOKENS at generated position i: bias[i] + sum over the other generated positions j of
    pair[i, j, token at j (or mask)]; the prompt's positions predict TOKENS uniformly (they are never read)."""

    def __init__(self, vocab_size: int, seed: int = 6, spread: float = 0.7, eos: float = -1.0) -> None:
        super().__init__()
        self.config = SimpleNamespace(vocab_size=vocab_size, eos_token_id=EOS, pad_token_id=2)
        g = torch.Generator().manual_seed(seed)
        k = len(TOKENS)
        bias = 0.5 * spread * torch.randn(N, k, generator=g)
        bias[:, 0] += eos  # EOS rarer than a, b
        self.bias = nn.Parameter(bias, requires_grad=False)
        pair = spread * torch.randn(N, N, k + 1, k, generator=g)  # [i, j, token at j (k: mask), token at i]
        pair[torch.arange(N), torch.arange(N)] = 0.0
        pair[:, :, k] = 0.0  # masks add nothing
        self.pair = nn.Parameter(pair, requires_grad=False)
        self.index = torch.full((vocab_size,), k, dtype=torch.long).index_copy(0, torch.tensor(TOKENS), torch.arange(k))

    def small(self, gen: torch.Tensor) -> torch.Tensor:
        """`[B, N]` generated regions -> `[B, N, len(TOKENS)]` logits."""
        i = torch.arange(N)
        return self.bias + self.pair[i[:, None], i[None, :], self.index[gen][:, None, :]].sum(2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> SimpleNamespace:
        B, L = input_ids.shape
        logits = torch.full((B, L, self.config.vocab_size), float("-inf"))
        logits[:, :, list(TOKENS)] = 0.0
        logits[:, L - N :, list(TOKENS)] = self.small(input_ids[:, L - N :])
        return SimpleNamespace(logits=logits)


@pytest.fixture(scope="module")
def table(tokenizer):
    return Table(len(tokenizer))


@pytest.fixture(scope="module")
def model(table, tokenizer):
    return MaskedDiffusionLM(table, tokenizer, "table", mask_token_id=MASK, shifted=False)


def exact_law(table: Table, temperature: float, block: int) -> dict[tuple[int, ...], float]:
    """The baseline's output law at one token per step, by enumerating its chain of canvases."""

    @lru_cache(maxsize=None)
    def law(gen: tuple[int, ...]) -> dict[tuple[int, ...], float]:
        out: Counter = Counter()
        first = gen.index(MASK)
        view = [j for j in range(first // block * block, min(first // block * block + block, N)) if gen[j] == MASK]
        with torch.no_grad():
            logits = table.small(torch.tensor([gen]))[0].double()  # [N, k]
        draw, conf = (logits / temperature).softmax(-1), logits.softmax(-1)
        for x0 in itertools.product(range(len(TOKENS)), repeat=len(view)):
            p = float(torch.prod(torch.stack([draw[j, t] for j, t in zip(view, x0, strict=True)])))
            best = max(range(len(view)), key=lambda m: (float(conf[view[m], x0[m]]), -m))  # lowest offset on ties
            nxt = list(gen)
            nxt[view[best]] = TOKENS[x0[best]]
            ids = nxt[: nxt.index(EOS) + 1] if EOS in nxt else nxt
            if MASK in ids:  # not settled through its first EOS yet
                for o, q in law(tuple(nxt)).items():
                    out[o] += p * q
            else:
                out[tuple(ids)] += p
        return dict(out)

    return law((MASK,) * N)


def two_sample_p_value(a: list, b: list) -> float:
    """Pearson's chi-square test that two samples of outcomes come from one law (a 2 x k contingency table);
    outcomes expecting < 5 draws in either sample are pooled into one cell."""
    cells = sorted(set(a) | set(b))
    counts = torch.tensor([[Counter(s)[c] for c in cells] for s in (a, b)], dtype=torch.float64)  # [2, k]
    expected = counts.sum(1, keepdim=True) * counts.sum(0, keepdim=True) / counts.sum()
    big = expected.min(0).values >= 5
    obs = torch.cat([counts[:, big], counts[:, ~big].sum(1, keepdim=True)], 1)
    exp = torch.cat([expected[:, big], expected[:, ~big].sum(1, keepdim=True)], 1)
    keep = exp[0] > 0
    stat = ((obs[:, keep] - exp[:, keep]) ** 2 / exp[:, keep]).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2))  # chi2 survival


def sample(model, method: str, temperature: float, block: int | None, salt: int) -> tuple[list[tuple], int]:
    """SEEDS seeded runs of ROWS rows -> their outputs and the forwards they spent in all."""
    outs, forwards = [], 0
    kw = dict(steps=N) if method == "dlm.baseline" else {}
    for seed in range(SEEDS):
        results = fastdecode.generate(model, [PROMPT] * ROWS, method, max_new_tokens=N, block_length=block,
                                      temperature=temperature, seed=1000 * salt + seed, **kw)
        outs += [tuple(r.token_ids) for r in results]
        forwards += sum(r.stats.forwards for r in results)
    return outs, forwards


@pytest.fixture(scope="module")
def draws(model):
    """sample(), each setting run once per module (the power tests reuse the baseline's draws) and with its own
    seeds: samples that are compared never share a random stream."""
    done: dict = {}

    def get(method: str, temperature: float, block: int | None) -> tuple[list[tuple], int]:
        key = (method, temperature, block)
        if key not in done:
            done[key] = sample(model, method, temperature, block, salt=len(done) + 1)
        return done[key]

    return get


def exact_p_value(outs: list[tuple], law: dict[tuple, float]) -> float:
    cells = sorted(law)
    assert set(outs) <= set(cells), "an output the baseline cannot produce"
    return chi_square_p_value([cells.index(o) for o in outs], torch.tensor([law[c] for c in cells]))


def test_the_law_is_spread_and_depends_on_the_context(table):
    law = exact_law(table, 1.0, N)
    assert abs(sum(law.values()) - 1) < 1e-9
    assert sum(p >= 0.01 for p in law.values()) >= 10 and max(law.values()) < 0.35
    # committing the first draw everywhere at once (parallel decoding) would give a different law
    probs = table.small(torch.full((1, N), MASK))[0].softmax(-1)
    independent = {o: 1.0 for o in law}
    for o in law:
        for j, t in enumerate(o):
            independent[o] *= float(probs[j, TOKENS.index(t)])
    assert sum(abs(law[o] - independent[o]) for o in law) / 2 > 0.1


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("block", [None, 2], ids=["one-block", "blocks-of-2"])
def test_freedave_samples_the_baselines_law(draws, table, temperature, block):
    base, base_forwards = draws("dlm.baseline", temperature, block)
    fast, fast_forwards = draws("dlm.freedave", temperature, block)
    assert fast_forwards < 0.95 * base_forwards  # drafts were accepted: not the baseline's chain run twice
    law = exact_law(table, temperature, block or N)
    assert exact_p_value(base, law) > 1e-3
    assert exact_p_value(fast, law) > 1e-3
    assert two_sample_p_value(fast, base) > 1e-3


def test_the_test_detects_another_temperature(draws, table):
    hot, _ = draws("dlm.baseline", 1.0, None)
    cool, _ = draws("dlm.baseline", 0.7, None)
    assert two_sample_p_value(cool, hot) < 1e-3
    assert exact_p_value(cool, exact_law(table, 1.0, N)) < 1e-3


def test_the_test_detects_drafts_accepted_without_verification(model, draws, table, monkeypatch):
    """FreeDave keeping every draft of a round (all its tokens from the round's one draw) fails the same tests."""
    base, _ = draws("dlm.baseline", 1.0, None)
    monkeypatch.setattr(freedave, "accepted", lambda row, plan, evaluated: len(plan.drafts) - 1)
    broken, _ = sample(model, "dlm.freedave", 1.0, None, salt=99)
    assert two_sample_p_value(broken, base) < 1e-3
    assert exact_p_value(broken, exact_law(table, 1.0, N)) < 1e-3
