"""spec.dlm_draft on tiny fp32 models: a masked-diffusion draft fills a block, the AR target verifies it.

Greedy output equals ar.greedy token for token (random tiny MDLMs in both logit conventions, and an oracle
draft that is always right), EOS and max_new_tokens cut inside a draft, the context window bounds the draft
canvas, seeded sampling repeats, and wrong drafts or parameters are refused with the error that says the fix.
(The sampling distribution is tested in tests/statistical/test_spec_dlm_draft_sampling.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import fastdecode
from fastdecode.bench.harness import read_rows, run_bench
from fastdecode.bench.suites import Suite
from fastdecode.engine import encode_batch
from fastdecode.errors import IncompatibleMethodError, ParameterError
from fastdecode.models.diffusion import MaskedDiffusionLM
from fastdecode.models.mdlm import MDLMConfig, MDLMForMaskedDiffusion
from fastdecode.registry import RunContext
from fastdecode.speculative.drafters.dlm_draft import DiffusionDrafter, DlmDraftConfig, context_window, in_order_prefix
from fastdecode.train.tokenizer import train_tokenizer

PROMPTS = ["the quick brown fox", "def add(a, b):", "Sort this", "0123456789 ABC abc the lazy dog jumps"]
LONG = PROMPTS[2]  # runs 40 tokens without EOS on the tiny model
MASK = 3  # the shared tokenizer's mask id (conftest.save_diffusion)


class Oracle(nn.Module):
    """A "diffusion model" that is always right: each mask gets the causal model's logits after the canvas before it,
    masks before it filled greedily first. `shifted` emits them one output early, as Dream does; `seen` records
    every canvas length."""

    def __init__(self, causal: nn.Module, shifted: bool = False, max_positions: int | None = None) -> None:
        super().__init__()
        self.causal, self.shifted, self.seen = causal, shifted, []
        c = causal.config
        self.config = SimpleNamespace(vocab_size=c.vocab_size, max_position_embeddings=max_positions,
                                      eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> SimpleNamespace:
        x = input_ids.clone()  # [1, L]
        L = x.shape[1]
        self.seen.append(L)
        mask = torch.tensor([MASK], device=x.device)
        for i in (x[0] == MASK).nonzero().flatten().tolist():
            x[0, i] = self.causal(input_ids=x[:, :i]).logits[0, -1].index_fill(-1, mask, -1e9).argmax()
        logits = self.causal(input_ids=x).logits  # [1, L, V]: output j scores position j + 1
        return SimpleNamespace(logits=logits if self.shifted else torch.cat([logits[:, :1], logits[:, :-1]], 1))


def oracle(target, shifted: bool = False, max_positions: int | None = None, adapter_shifted: bool | None = None):
    model = Oracle(target.model, shifted, max_positions)
    shift = shifted if adapter_shifted is None else adapter_shifted
    return MaskedDiffusionLM(model, target.tokenizer, "oracle", mask_token_id=MASK, shifted=shift)


@pytest.fixture(scope="module")
def dream(tmp_path_factory, tokenizer, save_diffusion_model):
    """A tiny random MDLM with Dream's shifted logits."""
    folder = save_diffusion_model(tmp_path_factory.mktemp("tiny-dream"), tokenizer, seed=2, logits_shift=True)
    return fastdecode.load(folder)


@pytest.fixture(scope="module")
def baseline(causal):
    return [r.token_ids for r in fastdecode.generate(causal, PROMPTS, "ar.greedy", max_new_tokens=40)]


def drafts(name, causal, diffusion, dream):
    if name.startswith("oracle"):
        return oracle(causal, shifted=name == "oracle-dream")
    return {"llada": diffusion, "dream": dream}[name]


@pytest.mark.parametrize("params", [{}, {"draft_steps": 3}, {"num_draft_tokens": 3, "draft_steps": 3},
                                    {"num_draft_tokens": 16, "draft_steps": 4}, {"context_window": 4}])
@pytest.mark.parametrize("draft", ["llada", "dream", "oracle", "oracle-dream"])
def test_batched_greedy_equals_ar_greedy(causal, diffusion, dream, baseline, draft, params):
    d = drafts(draft, causal, diffusion, dream)
    results = fastdecode.generate(causal, PROMPTS, "spec.dlm_draft", draft=d, max_new_tokens=40, **params)
    assert [r.token_ids for r in results] == baseline
    steps = params.get("draft_steps", 1)
    for r in results:
        s = r.stats
        assert s.accepted <= s.proposed and sum(s.accepted_per_position) == s.accepted
        assert s.forwards <= s.new_tokens and s.draft_forwards <= steps * s.forwards
    if draft.startswith("oracle") and "context_window" not in params:  # always right: k + 1 tokens a step
        k = params.get("num_draft_tokens", 8)
        assert all(r.stats.forwards == -(-r.stats.new_tokens // (k + 1)) for r in results)


def test_batched_stats_equal_one_by_one(causal, diffusion):
    batched = fastdecode.generate(causal, PROMPTS, "spec.dlm_draft", draft=diffusion, draft_steps=2, max_new_tokens=30)
    for prompt, b in zip(PROMPTS, batched, strict=True):
        s = fastdecode.generate(causal, prompt, "spec.dlm_draft", draft=diffusion, draft_steps=2, max_new_tokens=30)
        assert b.token_ids == s.token_ids
        assert (b.stats.forwards, b.stats.proposed, b.stats.accepted, b.stats.accepted_per_position) == (
            s.stats.forwards, s.stats.proposed, s.stats.accepted, s.stats.accepted_per_position)


@pytest.mark.parametrize("shifted", [False, True])
@pytest.mark.parametrize("k,steps", [(1, 1), (4, 1), (4, 2), (8, 8)])
def test_an_oracle_draft_is_accepted_k_plus_one_in_either_convention(causal, shifted, k, steps):
    rounds = 3
    events = list(fastdecode.stream(causal, LONG, "spec.dlm_draft", draft=oracle(causal, shifted), num_draft_tokens=k,
                                    draft_steps=steps, max_new_tokens=rounds * (k + 1)))
    r = events[-1].results[0]
    assert [len(e.tokens[0]) for e in events[:-1]] == [k + 1] * rounds
    assert r.stats.forwards == rounds and r.stats.accepted_per_position == [rounds] * k
    assert r.stats.draft_forwards == rounds * steps  # one draft forward per step when steps = 1


def test_the_logit_convention_matters(causal):
    """An oracle read with the wrong convention drafts the wrong positions: the output stays exact, acceptance drops."""
    wrong = fastdecode.generate(causal, LONG, "spec.dlm_draft", draft=oracle(causal, True, adapter_shifted=False),
                                max_new_tokens=27)
    right = fastdecode.generate(causal, LONG, "spec.dlm_draft", draft=oracle(causal, True), max_new_tokens=27)
    assert wrong.token_ids == right.token_ids
    assert right.stats.forwards == 3 and wrong.stats.forwards > 3


@pytest.mark.parametrize("shifted", [False, True])
def test_one_step_drafts_the_aligned_argmax(diffusion, dream, shifted):
    """With draft_steps=1 the block is the argmax (never the mask token) of the logits that score each position:
    output i for LLaDA, output i - 1 for Dream."""
    model = dream if shifted else diffusion
    context = torch.tensor(model.encode("the quick brown"))  # on the CPU, as the driver hands it (Drafter.propose)
    n, k = context.numel(), 5
    draft = DiffusionDrafter(model, DlmDraftConfig(num_draft_tokens=k), None).propose(context, 10)
    canvas = torch.cat([context, torch.full((k,), MASK)])[None].to(model.device)
    with torch.no_grad():
        raw = model.model(input_ids=canvas).logits[0].float()  # [n + k, V], unaligned
    raw[:, MASK] = float("-inf")
    rows = raw[n - 1 : n + k - 1] if shifted else raw[n : n + k]
    assert draft.tokens.tolist() == rows.argmax(-1).tolist() and draft.probs is None


def test_eos_inside_a_draft_stops_the_row(causal_dir, baseline):
    model = fastdecode.load(causal_dir)
    stop = baseline[2][3]  # inside the first oracle draft of 8
    model.model.generation_config.eos_token_id = [1, stop]
    ref = fastdecode.generate(model, PROMPTS, "ar.greedy", max_new_tokens=40)
    for d, steps in [(oracle(model), 1), (oracle(model, shifted=True), 3)]:
        out = fastdecode.generate(model, PROMPTS, "spec.dlm_draft", draft=d, draft_steps=steps, max_new_tokens=40,
                                  trace=True)
        for b, (r, a) in enumerate(zip(out, ref, strict=True)):
            assert r.token_ids == a.token_ids and r.stats.finish_reason == a.stats.finish_reason
            assert [t for e in r.trace for _, t in e.tokens[b]] == r.token_ids  # nothing after the EOS is emitted
        assert out[2].token_ids == baseline[2][:4] and out[2].stats.forwards == 1 and out[2].stats.accepted == 4


@pytest.mark.parametrize("n", [1, 2, 3, 7, 9])
@pytest.mark.parametrize("steps", [1, 2])
def test_max_new_tokens_inside_a_draft(causal, diffusion, baseline, n, steps):
    for d in (oracle(causal), diffusion):
        out = fastdecode.generate(causal, PROMPTS, "spec.dlm_draft", draft=d, draft_steps=steps, max_new_tokens=n,
                                  trace=True)
        for b, r in enumerate(out):
            assert r.token_ids == baseline[b][:n]
            assert sum(len(e.tokens[b]) for e in r.trace) == len(r.token_ids) <= n
            assert r.stats.proposed <= max(n - 1, 0) * r.stats.forwards


def test_the_context_window_bounds_the_draft_canvas(causal, baseline):
    short = oracle(causal, max_positions=12)
    out = fastdecode.generate(causal, PROMPTS, "spec.dlm_draft", draft=short, max_new_tokens=40)
    assert [r.token_ids for r in out] == baseline and max(short.model.seen) == 12  # 4 context tokens + 8 masks
    assert context_window(short, DlmDraftConfig()) == 4
    assert context_window(short, DlmDraftConfig(context_window=2)) == 2
    assert context_window(oracle(causal), DlmDraftConfig(context_window=5)) == 5
    assert context_window(oracle(causal), DlmDraftConfig()) is None
    windowed = oracle(causal)
    fastdecode.generate(causal, PROMPTS, "spec.dlm_draft", draft=windowed, context_window=3, num_draft_tokens=2,
                        max_new_tokens=9)
    assert max(windowed.model.seen) == 5


def test_in_order_prefix():
    assert in_order_prefix(torch.tensor([], dtype=torch.long)) == 0
    assert in_order_prefix(torch.tensor([0, 0, 0])) == 3
    assert in_order_prefix(torch.tensor([0, 1, 1, 2])) == 4
    assert in_order_prefix(torch.tensor([1, 0, 2])) == 1
    assert in_order_prefix(torch.tensor([0, 2, 1, 3])) == 2


@pytest.mark.parametrize("steps", [1, 4])
def test_sampled_drafts_carry_their_commit_distributions(diffusion, steps):
    cfg = DlmDraftConfig(num_draft_tokens=8, draft_steps=steps, temperature=0.7, top_k=5)
    drafter = DiffusionDrafter(diffusion, cfg, torch.Generator(diffusion.device).manual_seed(0))
    lengths = []
    for seed in range(6):
        drafter.generator.manual_seed(seed)
        d = drafter.propose(torch.tensor(diffusion.encode("the quick brown")), 20)
        k = d.tokens.numel()
        lengths.append(k)
        assert d.probs.shape == (k, diffusion.vocab_size)
        assert torch.allclose(d.probs.sum(-1), torch.ones(k, device=d.probs.device))
        assert ((d.probs > 0).sum(-1) <= 5).all()
        assert (d.probs[torch.arange(k), d.tokens] > 0).all() and (d.probs[:, MASK] == 0).all()
    assert drafter.forwards == 6 * steps
    if steps == 1:  # one step commits the block at once; with several only the prefix committed in order is kept
        assert set(lengths) == {8}


def test_seeded_sampling_repeats_and_seeds_differ(causal, diffusion):
    for steps in (1, 3):
        def run(seed, steps=steps):
            out = fastdecode.generate(causal, PROMPTS, "spec.dlm_draft", draft=diffusion, draft_steps=steps,
                                      temperature=1.5, seed=seed, max_new_tokens=24)
            return [r.token_ids for r in out]
        assert run(7) == run(7)
        assert run(7) != run(8)


def test_missing_causal_or_mismatched_drafts_are_refused(causal, diffusion, tokenizer):
    with pytest.raises(IncompatibleMethodError,
                       match="needs a draft model.*masked-diffusion LM.*--draft zoo:dlm-small"):
        fastdecode.generate(causal, "the", "spec.dlm_draft")
    with pytest.raises(IncompatibleMethodError,
                       match="must be a masked-diffusion LM, not a causal model.*--draft zoo:dlm-small"):
        fastdecode.generate(causal, "the", "spec.dlm_draft", draft=causal)
    # other draft methods still want a causal one
    with pytest.raises(IncompatibleMethodError, match="must be a causal LM"):
        fastdecode.generate(causal, "the", "spec.draft_model", draft=diffusion)
    smaller = MDLMForMaskedDiffusion(MDLMConfig(**{**diffusion.model.config.to_dict(), "vocab_size": 100}))
    with pytest.raises(IncompatibleMethodError, match="same tokenizer"):
        fastdecode.generate(causal, "the", "spec.dlm_draft",
                            draft=MaskedDiffusionLM(smaller, mask_token_id=MASK, shifted=False))
    other = train_tokenizer(["a completely different corpus of words and numbers 42"] * 8, vocab_size=len(tokenizer))
    renamed = MaskedDiffusionLM(diffusion.model, other, "renamed", mask_token_id=MASK, shifted=False)
    with pytest.raises(IncompatibleMethodError, match="other ids.*same tokenizer"):
        fastdecode.generate(causal, "the", "spec.dlm_draft", draft=renamed)
    batch = encode_batch(causal, [[5, 6]], 4)  # the driver called directly refuses too, before any step
    with pytest.raises(IncompatibleMethodError, match="masked-diffusion LM"):
        fastdecode.get_method("spec.dlm_draft").driver(causal, batch, DlmDraftConfig(), RunContext(draft=causal))


@pytest.mark.parametrize("params, message", [
    ({"num_draft_tokens": 0}, "num_draft_tokens"),
    ({"draft_steps": 0}, "draft_steps"),
    ({"num_draft_tokens": 4, "draft_steps": 5}, "between 1 and num_draft_tokens"),
    ({"context_window": -1}, "context_window"),
    ({"block": 8}, "Unknown parameter"),
    ({"temperature": -1.0}, "temperature"),
])
def test_bad_parameters_are_refused(causal, diffusion, params, message):
    with pytest.raises(ParameterError, match=message):
        fastdecode.generate(causal, "the", "spec.dlm_draft", draft=diffusion, **params)


def test_a_block_the_draft_positions_cannot_hold_is_refused(causal):
    with pytest.raises(ParameterError, match="num_draft_tokens=12.*at most 11"):
        fastdecode.generate(causal, "the", "spec.dlm_draft", draft=oracle(causal, max_positions=12),
                            num_draft_tokens=12)


def test_cli_generate_loads_a_diffusion_draft(causal_dir, diffusion_dir, causal):
    env = {**os.environ, "FASTDECODE_DEBUG": "0"}
    p = subprocess.run([sys.executable, "-m", "fastdecode", "generate", "-m", str(causal_dir),
                        "--draft", str(diffusion_dir), "--method", "spec.dlm_draft", "-p", "the quick",
                        "--max-new-tokens", "12", "--param", "draft_steps=2", "--json"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    row = json.loads(p.stdout)
    assert row["token_ids"] == fastdecode.generate(causal, "the quick", max_new_tokens=12).token_ids
    assert row["stats"]["draft_forwards"] > 0 and row["method"] == "spec.dlm_draft"


def test_bench_loads_a_diffusion_draft_by_path(causal_dir, diffusion_dir, tmp_path):
    """What `fastdecode bench --draft DIR` does: the harness loads the draft by its kind and every row runs."""
    suite = Suite("tiny", "one item", (("lists.sort", 1),))
    short = {"max_new_tokens": 8}
    summary = run_bench(suite, str(causal_dir), ["spec.dlm_draft"], tmp_path / "r.jsonl", draft=str(diffusion_dir),
                        params={"ar.greedy": short, "spec.dlm_draft": {**short, "draft_steps": 2}}, warmup=False)
    rows = read_rows(tmp_path / "r.jsonl")
    assert summary.written == 2 and {r["method"] for r in rows} == {"ar.greedy", "spec.dlm_draft"}
    assert all(r["equal_to_baseline"] for r in rows) and rows[1]["draft"] == str(diffusion_dir)
