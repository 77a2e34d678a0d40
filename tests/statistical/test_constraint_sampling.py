"""Constrained sampling keeps constrained ar.sample's distribution on every path: spec.* with a sampled drafter
(a draft cut after its first forbidden token, which the masked target rejects surely) and with a deterministic
drafter (cut before it); chi-square tests of the first two tokens against the exact masked marginals. Then
Grammar-Aligned Decoding (ASAp): its samples follow the exact grammar-conditioned distribution of a tiny finite
grammar, which plain masking does not."""

from __future__ import annotations

import pytest
import torch
from sampling_stats import PROCESSORS, N, chi_square_p_value, first_two

import fastdecode
from fastdecode import constraints
from fastdecode.engine import encode_batch
from fastdecode.registry import RunContext
from fastdecode.sampling.config import SamplingConfig
from fastdecode.sampling.pipeline import LogitsPipeline
from fastdecode.speculative.drafter import SpecConfig
from fastdecode.speculative.drafters.draft_model import DraftModelConfig, ModelDrafter
from fastdecode.speculative.driver import speculative

pytest.importorskip("llguidance")
REGEX = r"[a-z ]{1,12}\."


def last_logits(causal, ids: torch.Tensor) -> torch.Tensor:
    """`[B, L]` CPU prompts (same length) -> `[B, V]` next-token logits on the CPU, the model run on its device."""
    ids = ids.to(causal.device)
    return causal.forward(ids, torch.arange(ids.shape[1], device=ids.device).expand_as(ids))[:, -1].cpu()


def masked_marginals(causal, prompt, compiled):
    """Exact first-token distribution of constrained ar.sample, and the second token's given a non-EOS first (on the
    CPU: the model runs on its device, its logits come back)."""
    pipe = LogitsPipeline.from_config(SamplingConfig(**PROCESSORS), constraint=compiled)
    ids = torch.tensor([prompt])
    hist = pipe.history(ids, causal.vocab_size)
    p1 = pipe.distributions(last_logits(causal, ids), hist.rows())[0]
    support = [x for x in p1.nonzero().squeeze(-1).tolist() if x not in causal.eos_token_ids]
    rows = ids.expand(len(support), -1)
    hist = pipe.history(rows, causal.vocab_size)
    hist.append(torch.tensor(support))
    both = torch.cat([rows, torch.tensor(support)[:, None]], 1)
    logits = last_logits(causal, both)
    weights = p1[support] / p1[support].sum()
    p2 = (weights[:, None] * pipe.distributions(logits, hist.rows())).sum(0)
    return p1, p2


@pytest.fixture(scope="module")
def compiled_marginals(causal, prompt):
    compiled = constraints.regex(REGEX).compile(causal)
    return masked_marginals(causal, prompt, compiled)


def test_constrained_ar_sample_matches_the_masked_distribution(causal, prompt, compiled_marginals):
    rows = fastdecode.generate(causal, [prompt] * N, "ar.sample", seed=21, max_new_tokens=2,
                               constraint=constraints.regex(REGEX), **PROCESSORS)
    first, second = first_two([r.token_ids for r in rows])
    assert chi_square_p_value(first, compiled_marginals[0]) > 1e-3
    assert chi_square_p_value(second, compiled_marginals[1]) > 1e-3


def test_constrained_sampled_drafter_matches_constrained_ar_sample(causal, near_draft, prompt, compiled_marginals):
    compiled = constraints.regex(REGEX).compile(causal)
    rows = fastdecode.generate(causal, [prompt] * N, "spec.draft_model", draft=near_draft, seed=22,
                               max_new_tokens=2, num_draft_tokens=2, constraint=compiled, **PROCESSORS)
    assert sum(r.stats.accepted for r in rows) > 0.1 * N
    first, second = first_two([r.token_ids for r in rows])
    assert chi_square_p_value(first, compiled_marginals[0]) > 1e-3
    assert chi_square_p_value(second, compiled_marginals[1]) > 1e-3


def test_constrained_deterministic_drafter_matches_constrained_ar_sample(causal, prompt, compiled_marginals):
    """The unconstrained model's own greedy drafts (often forbidden, so cut), verified as q one-hot."""
    compiled = constraints.regex(REGEX).compile(causal)
    cfg = SpecConfig(max_new_tokens=2, seed=23, **PROCESSORS)
    batch = encode_batch(causal, [prompt] * N, cfg.max_new_tokens)
    greedy_self = lambda generator: ModelDrafter(causal, DraftModelConfig(num_draft_tokens=2), None)  # noqa: E731
    rows: list[dict[int, int]] = [{} for _ in range(N)]
    for event in speculative(causal, batch, cfg, RunContext(constraint=compiled), greedy_self):
        for b, pairs in enumerate(event.tokens):
            rows[b].update(pairs)
    first, second = first_two([[row[i] for i in sorted(row)] for row in rows])
    assert chi_square_p_value(first, compiled_marginals[0]) > 1e-3
    assert chi_square_p_value(second, compiled_marginals[1]) > 1e-3


# --- Grammar-Aligned Decoding
GAD_REGEX = r"(a|b|c)(a|b)?"  # finite: every token sequence spelling it can be enumerated


def exact_and_masked(causal, prompt, compiled):
    """Every token sequence the grammar allows (through EOS), with its probability under the model conditioned on
    the grammar (exact) and under plain masked sampling (biased)."""
    proc = compiled.processor()
    eos = causal.eos_token_ids
    out: dict[tuple[int, ...], tuple[float, float]] = {}

    def walk(path: tuple[int, ...], p_model: float, p_masked: float) -> None:
        probs = last_logits(causal, torch.tensor([prompt + list(path)]))[0].float().softmax(-1)
        allowed = proc.mask(proc.advance_all(proc.begin(prompt), path))
        mass = float(probs[allowed].sum())
        for x in allowed.nonzero().squeeze(-1).tolist():
            q = float(probs[x])
            if x in eos:
                out[path + (x,)] = (p_model * q, p_masked * q / mass)
            else:
                walk(path + (x,), p_model * q, p_masked * q / mass)

    walk((), 1.0, 1.0)
    keys = sorted(out)
    exact = torch.tensor([out[k][0] for k in keys], dtype=torch.float64)
    masked = torch.tensor([out[k][1] for k in keys], dtype=torch.float64)
    return keys, exact / exact.sum(), masked


def test_gad_converges_to_the_grammar_conditioned_distribution(causal, prompt):
    gad = constraints.regex(GAD_REGEX, sampling="gad")
    keys, exact, masked = exact_and_masked(causal, prompt, gad.compile(causal))
    assert 0.5 * (exact - masked).abs().sum() > 0.1  # masking is biased here: the test can tell them apart
    index = {k: i for i, k in enumerate(keys)}

    def draw(c, calls: int, seed: int) -> list[int]:
        got = []
        gen = torch.Generator(causal.device).manual_seed(seed)  # a generator lives on the model's device
        for _ in range(calls):
            rows = fastdecode.generate(causal, [prompt] * 20, "ar.sample", generator=gen, max_new_tokens=4,
                                       constraint=c)
            got += [index[tuple(r.token_ids)] for r in rows]
        return got

    draw(gad, 10, 31)  # ASAp's burn-in: the estimates become exact along the paths it samples
    samples = draw(gad, 40, 32)
    assert chi_square_p_value(samples, exact) > 1e-3
    plain = draw(constraints.regex(GAD_REGEX), 40, 33)
    assert chi_square_p_value(plain, masked) > 1e-3  # plain masking follows its own (biased) law
    assert chi_square_p_value(plain, exact) < 1e-3
