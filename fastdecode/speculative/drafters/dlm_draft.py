"""spec.dlm_draft: a masked-diffusion LM drafts a whole block for an AR target, which verifies it (DEER, arXiv
2512.15176).

The draft model sees the context followed by k mask tokens and fills the block in `draft_steps` forwards
(1 = DEER's single-step drafting: one forward for the whole block). The target verifies the block through the
one speculative driver, so greedy output equals ar.greedy. DEER aligns its drafter to the target by
distillation; here any masked-diffusion LM that shares the target's tokenizer drafts (LLaDA's same-position and
Dream's shifted logits are both realigned by the adapter).

Sampling uses the standard per-position proposal: x_i is drawn from q_i, the draft's distribution at the step
that commits it (the target's processors applied), and verify_sampling checks it against q_i. That is exact when
x_i ~ q_i given x_<i (Leviathan et al., Theorem 3.5), which holds when no earlier position was committed after
x_i (same-step draws are independent, and which positions commit is decided before any draw). If an earlier
position j < i committed later, its token was drawn seeing x_i, and given x_j, x_i is no longer distributed as
q_i: a sampled draft is therefore cut to the prefix committed in order (with draft_steps=1, the whole block).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ...config import check
from ...diffusion.rules import select_topk
from ...diffusion.scores import num_transfer_tokens
from ...errors import IncompatibleMethodError
from ...models.causal import CausalLM
from ...models.diffusion import MaskedDiffusionLM
from ...registry import RunContext
from ...types import PromptBatch, StepEvent
from ..drafter import BaseDrafter, Draft, SpecConfig, register_spec
from ..driver import speculative
from ..verify import target_distribution


@dataclass(frozen=True)
class DlmDraftConfig(SpecConfig):
    num_draft_tokens: int = 8  # k: the block of masks after the context that the draft model fills
    draft_steps: int = 1  # draft forwards per block, committing the most confident masks; 1 = the whole block at once
    context_window: int = 0  # the draft model sees at most this many last context tokens; 0 = what its positions allow

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.num_draft_tokens >= 1, "num_draft_tokens", self.num_draft_tokens, "must be at least 1")
        check(1 <= self.draft_steps <= self.num_draft_tokens, "draft_steps", self.draft_steps,
              f"must be between 1 and num_draft_tokens ({self.num_draft_tokens}): each draft forward commits a token")
        check(self.context_window >= 0, "context_window", self.context_window, "must be >= 0 (0 = no limit)")


def context_window(draft: MaskedDiffusionLM, cfg: DlmDraftConfig) -> int | None:
    """The most context tokens one draft canvas holds (None: all): the draft's positions less the block, at most
    `context_window`. Refuses a block that leaves the draft model no position for context."""
    limit = draft.max_positions
    room: int | None = None
    if limit is not None:
        room = limit - cfg.num_draft_tokens
        check(room >= 1, "num_draft_tokens", cfg.num_draft_tokens,
              f"leaves no context in the draft model's {limit} positions: use at most {limit - 1}")
    sizes = [s for s in (room, cfg.context_window) if s]
    return min(sizes) if sizes else None


def in_order_prefix(step_of: torch.Tensor) -> torch.Tensor:
    """`[k]` the draft step that committed each position -> `[1]` length of the longest prefix committed in order
    (step_of non-decreasing), where step_of is (nothing read). Only there is x_i drawn from q_i given x_<i, as
    verify_sampling needs."""
    if step_of.numel() == 0:
        return torch.zeros(1, dtype=torch.long, device=step_of.device)
    return 1 + (step_of[1:] >= step_of[:-1]).long().cumprod(0).sum().view(1)


class DiffusionDrafter(BaseDrafter):
    """Fills a canvas [context window, k masks] with the draft model; stateless between steps (no draft cache)."""

    def __init__(self, draft: MaskedDiffusionLM, cfg: DlmDraftConfig, generator: torch.Generator | None) -> None:
        self.draft, self.cfg, self.generator = draft, cfg, generator
        self.window = context_window(draft, cfg)
        self.forwards = 0

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        k = min(k, self.cfg.num_draft_tokens)
        ctx = context if self.window is None else context[-self.window :]
        n, mask_id, device = ctx.numel(), self.draft.mask_token_id, self.draft.device
        canvas = torch.cat([ctx, torch.full((k,), mask_id, dtype=torch.long)]).to(device)  # [n + k]
        masked = torch.ones(k, dtype=torch.bool, device=device)  # [k]
        step_of = torch.zeros(k, dtype=torch.long, device=device)  # [k] the step that committed each position
        probs = None  # [k, V] q_i at the commit of x_i (sampling only)
        steps = min(self.cfg.draft_steps, k)  # a draft cut short by max_new_tokens needs fewer steps
        counts = num_transfer_tokens(torch.tensor([k]), steps)[0].tolist()  # LLaDA's even split, remainder first
        for t, count in enumerate(counts):
            logits = self.draft.forward(canvas[None])[0, n:]  # [k, V], logits[i] scores block position i
            self.forwards += 1
            q = self._distribution(logits.index_fill(-1, torch.tensor([mask_id], device=device), float("-inf")))
            # rank by the distribution's confidence, known before any draw, so that which positions commit
            # never depends on the tokens drawn there
            score = q.max(-1).values.masked_fill(~masked, float("-inf"))  # [k]
            commit = select_topk(score[None], torch.tensor([count], device=device))[0]  # [k] bool
            # (a boolean mask's indexing, or an assignment through one, finds its places on the host first: a
            # synchronisation on a GPU; `torch.where` and the committed positions as indices do not)
            if self.cfg.greedy:
                canvas[n:] = torch.where(commit, q.argmax(-1), canvas[n:])
            else:  # one draw per committed position (exactly `count`: as many stay masked), in position order
                at = torch.sort(commit.long(), descending=True, stable=True).indices[:count].sort().values
                canvas[n + at] = self._pick(q.index_select(0, at))
                step_of[at] = t
                probs = q if probs is None else torch.where(commit[:, None], q, probs)
            masked &= ~commit
        if self.cfg.greedy:  # greedy verification is exact for any draft; left unread where it was drafted, for the
            return Draft(canvas[n:])  # verification to read with its verdict (one synchronisation a step)
        assert probs is not None  # sampling: set by the first commit
        if steps == 1:  # one draft forward committed the whole block: all in order, left unread as greedy's is
            return Draft(canvas[n:], probs)
        # the in-order prefix's length and the drafts in one read
        values = torch.cat([in_order_prefix(step_of), canvas[n:]]).tolist()
        m = values[0]
        return Draft(torch.tensor(values[1 : 1 + m], dtype=torch.long), probs[:m])

    def _distribution(self, logits: torch.Tensor) -> torch.Tensor:
        """`[k, V]` -> q: the softmax when greedy; with the target's temperature / top-k / top-p when sampling."""
        if self.cfg.greedy:
            return logits.softmax(-1)
        return target_distribution(logits, self.cfg.temperature, self.cfg.top_k, self.cfg.top_p)

    def _pick(self, q: torch.Tensor) -> torch.Tensor:
        """`[c, V]` -> `[c]`: one independent draw x_i ~ q_i each (sampling; greedy takes the argmax above)."""
        return torch.multinomial(q, 1, generator=self.generator).squeeze(-1)


@register_spec("spec.dlm_draft", config=DlmDraftConfig, needs_draft=True, draft_kind="diffusion")
def run(model: CausalLM, batch: PromptBatch, cfg: DlmDraftConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """DEER-style speculative decoding: a masked-diffusion draft model (pass draft=) fills a block of masks at once."""
    draft = ctx.draft
    if not isinstance(draft, MaskedDiffusionLM):
        raise IncompatibleMethodError(
            "spec.dlm_draft drafts with a masked-diffusion LM that shares the target's tokenizer: pass "
            "draft=fastdecode.load('zoo:dlm-small') (CLI: --draft zoo:dlm-small) or another LLaDA / Dream-style model."
        )
    context_window(draft, cfg)  # a block the draft's positions cannot hold is refused before the first step
    return speculative(model, batch, cfg, ctx, lambda generator: DiffusionDrafter(draft, cfg, generator))
