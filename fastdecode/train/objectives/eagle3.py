"""EAGLE-3's training-time test (Li et al. 2025; SafeAILab/EAGLE `eagle/traineagle3/cnets.py`, SpecForge's
`OnlineEagle3Model`): the head is unrolled for `ttt` steps over every position of a batch at once, each step fed the
layer's own outputs of the step before, so that it learns to draft from its own features as it must at decode time.

At step i, row p reads the embedding of token p+1+i and (step 0) the target's fused feature f_p or (later steps)
its own step-(i-1) output at row p, sits at rotary position p+i, and predicts token p+2+i. Its attention sees the
step-0 entries of rows <= p and one entry per later step, its own row's: exactly the cache a chain drafted from
position p holds at decode time. The loss is sum_i 0.8^i * soft cross-entropy against the target's distribution at
p+1+i restricted to the draft vocabulary, on answer tokens whose target argmax the draft vocabulary holds.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ...heads.base import Target
from ...heads.eagle3 import Eagle3Head, default_layers, target_embeddings
from .base import HeadObjective, TargetBatch, head_device

DECAY = 0.8  # the authors' per-step loss weight
TTT_STEPS = 5  # unrolled steps (the authors use 7; decoding drafts k = 5)
DRAFT_VOCAB = 1024
COUNT_ITEMS = 4000  # training items whose answers are counted for the draft vocabulary when no data is given


class Eagle3Objective(HeadObjective):
    kind = "eagle3"
    method = "spec.eagle3"  # what decodes with the head (the loop measures it for the card)

    def target_layers(self, target: Any, options: dict[str, Any]) -> tuple[int, ...]:
        return _layers(target, options)

    def build_head(self, target: Any, options: dict[str, Any]) -> Eagle3Head:
        """A head shaped like `target`, randomly initialised as the authors' (`init`: "random"), or its output side
        from the target (`init`: "target"); options: `draft_vocab` (1024), `layers` ("1,3,5"), `ttt` (5),
        `token_counts` (a `[V]` tensor of the training data's token counts; default: counted on the reference
        answers of training items)."""
        head = Eagle3Head.for_target(target, draft_vocab_size=int(options.get("draft_vocab", DRAFT_VOCAB)),
                                     layers=_layers(target, options))
        counts = options.get("token_counts")
        head.set_vocab(counts if isinstance(counts, torch.Tensor) else answer_counts(target, head.config.vocab_size))
        head.ttt_length = int(options.get("ttt", TTT_STEPS))
        self._target = target if options.get("init", "random") == "target" else None
        if self._target is not None:
            head.pass_high_layer()
            head.copy_output(target)
        return head

    _target: Any = None  # the target of the last head built from it (prepare copies its output rows again)

    def card_lines(self, options: dict[str, Any]) -> list[str]:
        steps = int(options.get("ttt", TTT_STEPS))
        return [f"EAGLE-3 head: `fc` over the target layers' outputs, one decoder layer whose attention reads "
                f"[input_layernorm(emb); hidden_norm(feature)], a draft vocabulary of the most frequent answer tokens "
                f"(`d2t`/`t2d`). Training-time test: {steps} unrolled steps, loss sum_i {DECAY}^i soft cross-entropy "
                f"against the target's distribution on the draft vocabulary. The same tensors in "
                f"SpecForge/SGLang/vLLM's layout: `fastdecode.heads.eagle3_io.save_eagle3`.", ""]

    def prepare(self, head: Any, examples: list[Any]) -> None:
        """The draft vocabulary: the most frequent tokens of the target's own answers (SpecForge counts the tokens
        under its loss mask the same way)."""
        head.set_vocab(token_counts([e.ids[e.prompt_len :] for e in examples], head.config.vocab_size))
        if self._target is not None:
            head.copy_output(self._target)  # the rows of the fitted vocabulary

    def head_loss(self, head: Any, target: Any, batch: TargetBatch,
                  gen: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        steps = int(getattr(head, "ttt_length", TTT_STEPS))
        losses, accs = ttt_losses(head, target_embeddings(target), batch, steps)
        loss = sum(DECAY**i * part for i, part in enumerate(losses))
        assert isinstance(loss, torch.Tensor)
        metrics = {f"acc{i}": a for i, a in enumerate(accs)}
        metrics["tau"] = simulated_tau(accs)
        return loss, metrics


def ttt_losses(head: Eagle3Head, embed: torch.nn.Module, batch: TargetBatch,
               steps: int) -> tuple[list[torch.Tensor], list[float]]:
    """Each unrolled step's soft cross-entropy (mean over its counted positions) and its top-1 agreement with the
    target's argmax on answer tokens (out-of-vocabulary targets count as misses).

    Step 0 runs every row (all are keys of later steps); later steps only the rows from which some step still
    predicts an answer token (rows deep inside the prompts are never queried again), and logits are taken only
    where an answer token is predicted."""
    device = head_device(head)  # the batch comes from the loop on the CPU; the loss runs where the head is
    batch = batch.to(device)
    ids, real, answer = batch.ids, batch.attention.bool(), batch.answer.bool()
    B, T = ids.shape
    embed_device = next(embed.parameters()).device
    pad = steps + 2
    ids_ext = F.pad(ids, (0, pad))  # [B, T + pad]
    answer_ext = F.pad(answer & real, (0, pad))
    logits_ext = F.pad(batch.logits.float(), (0, 0, 0, pad))  # [B, T + pad, V]
    positions = torch.arange(T, device=device)[None].expand(B, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    allow = (causal[None] & real[:, None, :]) | torch.eye(T, dtype=torch.bool, device=device)[None]  # [B, T, T]
    first = int(answer_ext.float().argmax(-1).min()) if bool(answer.any()) else T  # earliest answer token
    lo = max(0, min(T - 1, first - 1 - steps))  # rows below lo are not queried after step 0
    t2d = head.t2d.to(device)
    h = head.fuse(batch.layers)  # [B, T, H]
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    losses, accs = [], []
    start = 0  # the first row this step runs
    for i in range(steps):
        with torch.no_grad():  # the target's embeddings are frozen
            emb = embed(ids_ext[:, start + 1 + i : 1 + i + T].to(embed_device)).to(device)  # [B, T', H] token p+1+i
        h = head.ttt_step(emb, h, positions[:, start:] + i, keys, values, allow[:, start:])
        counted = answer_ext[:, start + 2 + i : 2 + i + T]  # [B, T'] row p predicts answer token p+2+i
        teacher = logits_ext[:, start + 1 + i : 1 + i + T][counted]  # [N, V] the target at p+1+i
        draft = head.logits(h[counted]).float()  # [N, V']
        best = teacher.argmax(-1)  # [N]
        kept = t2d[best]  # [N] the draft vocabulary holds the target's choice
        p = teacher[:, t2d].softmax(-1)  # [N, V'] the target's distribution on the draft vocabulary
        ce = -(p * draft.log_softmax(-1)).sum(-1)  # [N]
        losses.append((ce * kept).sum() / kept.sum().clamp(min=1))
        with torch.no_grad():
            hit = head.to_target(draft.argmax(-1)) == best
            accs.append(float(hit.sum()) / max(1, best.numel()))
        if i == 0 and lo > 0:  # from now on only rows lo.. are queried
            h, start = h[:, lo:], lo
    return losses, accs


def simulated_tau(accs: list[float]) -> float:
    """Expected tokens per verification of a chain if step i's accuracy were its acceptance given the earlier ones:
    1 + sum_k prod_{i<=k} acc_i (NeMo's tau_sim)."""
    tau, run = 1.0, 1.0
    for a in accs:
        run *= a
        tau += run
    return tau


def token_counts(rows: list[list[int]], vocab_size: int) -> torch.Tensor:
    """`[V]` how often each token id occurs in `rows`."""
    counts = torch.zeros(vocab_size)
    for row in rows:
        ids = torch.tensor(row, dtype=torch.long)
        counts += torch.bincount(ids[(ids >= 0) & (ids < vocab_size)], minlength=vocab_size).float()
    return counts


def answer_counts(target: Any, vocab_size: int, items: int = COUNT_ITEMS, seed: int = 0) -> torch.Tensor:
    """`[V]` token counts over the reference answers of `items` training items (train seeds, the zoo mixture): close
    to the target's own answers, for a head built outside the training loop (whose `prepare` counts those). A target
    without a tokenizer counts nothing (the draft vocabulary is then the first ids)."""
    tokenizer = getattr(target, "tokenizer", None)
    if tokenizer is None:
        return torch.zeros(vocab_size)
    from ..data import DEFAULT_MIXTURE, encode, item_stream

    stream = item_stream(DEFAULT_MIXTURE, seed)
    examples = [encode(tokenizer, next(stream)) for _ in range(items)]
    return token_counts([e.ids[e.prompt_len :] for e in examples], vocab_size)  # the tokens a drafter guesses


def _layers(target: Any, options: dict[str, Any]) -> tuple[int, ...]:
    given = options.get("layers")
    if given is None:
        return default_layers(Target.of(target).num_layers)
    if isinstance(given, str):
        given = [int(x) for x in given.replace(";", ",").split(",") if x.strip()]
    return tuple(int(x) for x in given)
