"""dlm.prophet against the authors' `generate_earlyexit`, re-written in this file (fp32, CPU, tiny random MDLM)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fastdecode

GEN = 16


def prophet_generate(logits_fn, prompt: torch.Tensor, steps: int, gen_length: int, block_length: int, mask_id: int,
                     constraints: dict[int, int], answer_start_pos: int | None,
                     thresholds: tuple[float, float, float]) -> tuple[torch.Tensor, int]:
    """pixeli99/Prophet `generate_earlyexit.generate` (batch of 1, temperature 0, no guidance, low-confidence
    remasking), re-written from the reference: constraints written before the first forward and after every step,
    progress = global step (from 1) / steps, the mean top-1 minus top-2 logit gap over the 5 positions from
    `answer_start_pos` (absolute), and on exit every mask filled with its prediction. Exactly equal confidences go to
    the lower position (torch.topk leaves their order unspecified). -> (canvas, forwards)."""
    P = prompt.shape[1]
    x = torch.full((1, P + gen_length), mask_id, dtype=torch.long)
    x[:, :P] = prompt
    for pos, tok in constraints.items():
        x[:, P + pos] = tok
    steps_per_block = steps // (gen_length // block_length)
    global_step = 0
    for b in range(gen_length // block_length):
        lo, hi = P + b * block_length, P + (b + 1) * block_length
        n = int((x[:, lo:hi] == mask_id).sum())
        k = [n // steps_per_block + (i < n % steps_per_block) for i in range(steps_per_block)]
        for i in range(steps_per_block):
            global_step += 1
            mask_index = x == mask_id
            logits = logits_fn(x, None)
            x0 = torch.argmax(logits, dim=-1)
            x0_p = torch.gather(F.softmax(logits, dim=-1), -1, x0[..., None]).squeeze(-1)
            if answer_start_pos is not None:
                positions = range(answer_start_pos, min(P + gen_length, answer_start_pos + 5))
                gaps = []
                for pos in positions:
                    top2 = torch.topk(logits[0, pos], k=2).values
                    gaps.append(float(top2[0] - top2[1]))
                progress = global_step / steps
                need = thresholds[0] if progress < 0.33 else thresholds[1] if progress < 0.67 else thresholds[2]
                if gaps and sum(gaps) / len(gaps) >= need:
                    x[mask_index] = x0[mask_index]
                    return x, global_step
            x0_p[:, hi:] = -np.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, -np.inf)
            if k[i] > 0:
                select = confidence[0].argsort(descending=True, stable=True)[: k[i]]
                x[0, select] = x0[0, select]
            for pos, tok in constraints.items():
                x[:, P + pos] = tok
    return x, global_step


def model_logits(model):
    """The model as the reference loop sees it; the loop runs on the CPU whatever the model's device."""
    def fn(x, attention_mask):
        mask = None if attention_mask is None else attention_mask.to(model.device)
        logits = model.forward(x.to(model.device), mask).cpu().clone()  # [B, T, V]
        logits[..., model.mask_token_id] = -1e9  # the model never predicts MASK, as a trained LLaDA
        return logits
    return fn


@pytest.mark.parametrize("gap", [0.0, 0.01, 0.02, 0.05, 1e9])  # the tiny model's gaps are small
@pytest.mark.parametrize("prompt", ["the quick brown fox", "def add(a, b):"])
def test_equals_the_authors_early_exit_with_constraints_and_an_answer_window(diffusion, prompt, gap):
    # blocks of 8, 4 steps each; the forced tokens leave 4 to 7 masks in block 1, so no step has k = 0
    words = "9:the|11:the"
    forced = {}  # the authors' evaluation: each word encoded with a leading space, its tokens from OFFSET on
    for offset, word in ((9, "the"), (11, "the")):
        for i, t in enumerate(diffusion.tokenizer.encode(" " + word, add_special_tokens=False)):
            forced[offset + i] = t
    assert 1 <= len(forced) <= 4 and all(8 <= o < GEN for o in forced)
    levels = (gap, gap, gap / 2)
    r = fastdecode.generate(diffusion, prompt, "dlm.prophet", max_new_tokens=GEN, block_length=8, steps=GEN // 2,
                            constraints=words, gap_early=levels[0], gap_mid=levels[1], gap_late=levels[2])
    ids = torch.tensor([r.prompt_ids])
    P = ids.shape[1]
    ref, forwards = prophet_generate(model_logits(diffusion), ids, GEN // 2, GEN, 8, diffusion.mask_token_id, forced,
                                     P + max(forced) + 2, levels)
    out = ref[0, P:].tolist()
    cut = next((i + 1 for i, t in enumerate(out) if t in diffusion.eos_token_ids), GEN)
    assert r.token_ids == out[:cut]
    assert all(r.token_ids[o] == t for o, t in forced.items() if o < cut)
    if cut == GEN:
        assert r.stats.forwards == forwards
    if gap == 0.0:  # the first step's gap passes: everything at once (the forced tokens kept)
        assert forwards == 1 and r.stats.forwards == 1
    if gap == 1e9:
        assert forwards == GEN // 2


@pytest.mark.parametrize("params", [dict(), dict(answer_start=4), dict(gap_over="answer", answer_start=0)])
def test_progress_counts_steps_from_one(diffusion, params):
    # no early exit in the first third, any gap after: the authors stop at step t with t / 16 >= 0.33, t = 6
    r = fastdecode.generate(diffusion, "the quick brown fox", "dlm.prophet", max_new_tokens=GEN, block_length=8,
                            gap_early=1e9, gap_mid=0.0, gap_late=0.0, trace=True, **params)
    assert len(r.trace) == 6
    assert r.trace[-1].accepted[0] == GEN - 5 or r.stats.finish_reason == "eos"


@pytest.mark.parametrize(
    "params, words",
    [
        (dict(gap_over="answer"), "needs an answer window"),
        (dict(constraints="x:The"), "OFFSET:WORD"),
        (dict(constraints="99:The"), "generated offsets 0 to 15"),
        (dict(answer_start=16), "generated offset"),
        (dict(answer_length=0), "at least 1"),
    ],
)
def test_bad_parameters_are_refused(diffusion, params, words):
    with pytest.raises(fastdecode.ParameterError, match=words):
        fastdecode.generate(diffusion, "the", "dlm.prophet", max_new_tokens=GEN, **params)
