"""spec.dflash: DFlash block drafting (z-lab/dflash, arXiv 2602.06036): a small non-causal drafter that reads the
target's own features fills a block of B - 1 masks after the last verified token in one forward; the target
verifies the block through the one speculative driver, so greedy output equals ar.greedy.

The drafter's context is the fused features of every verified token but the last (that one's features only exist
once the target has run on it, in the next verification forward). Each draft layer's keys and values of that context
are computed once, when a verification hands over the new tokens' layer outputs, and appended to the drafter's own
cache. Only verified tokens ever enter it (the block's own keys are recomputed in every forward and never stored), so
a rejection leaves nothing to crop: the authors' `crop` of the block entries is implicit.

Sampling draws each block position independently from the drafter's distribution q_i (target processors applied):
one forward fills the whole block, so x_i does not depend on x_<i and verification by q_i is exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ...config import check
from ...errors import ModelLoadError
from ...heads.dflash import KV, DFlashHead, target_parts
from ...heads.dflash_layout import is_dflash_layout, load_dflash
from ...heads.io import head_for, held
from ...models.causal import CausalLM
from ...models.hidden import layer_list
from ...registry import RunContext
from ...types import PromptBatch, StepEvent
from ..drafter import BaseDrafter, Draft, SpecConfig, Verification, register_spec
from ..driver import speculative
from ..verify import target_distribution


@dataclass(frozen=True)
class DFlashSpecConfig(SpecConfig):
    num_draft_tokens: int = 0  # masks filled per block, at most the head's block size - 1; 0 = block size - 1
    # the drafter: a folder (save_head's, or a DFlash checkpoint in the authors' / SpecForge layout) or
    # zoo:<model>/<head>; "" = the head shipped for a zoo model (train one for another model with
    # `fastdecode train drafter --target MODEL --kind dflash`)
    head: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.num_draft_tokens >= 0, "num_draft_tokens", self.num_draft_tokens,
              "must be >= 0 (0 = the head's block size - 1)")


def dflash_head(model: CausalLM, head: str = "") -> DFlashHead:
    """The DFlash head `spec.dflash` decodes `model` with (see `DFlashSpecConfig.head`)."""
    if head and Path(head).expanduser().is_dir() and is_dflash_layout(head):
        found = held(model, ("dflash-layout", head), Path(head).expanduser(), lambda: load_dflash(head, model))
    else:
        found = head_for(model, "dflash", head or None)  # type: ignore[assignment]
    if not isinstance(found, DFlashHead):
        raise ModelLoadError(f"{head} holds a {found.kind!r} head, not a DFlash one")
    return found.eval()


class DFlashDrafter(BaseDrafter):
    """One row's drafter: the context's K/V per draft layer, grown from each verification's layer outputs."""

    def __init__(self, model: CausalLM, head: DFlashHead, cfg: DFlashSpecConfig,
                 generator: torch.Generator | None) -> None:
        self.model, self.head, self.cfg, self.generator = model, head, cfg, generator
        self.embed, self.lm_head = target_parts(model)
        self.hidden_layers = tuple(head.config.target_layers)
        width = head.config.block_size - 1
        self.length = min(cfg.num_draft_tokens, width) if cfg.num_draft_tokens else width
        self.kv: list[KV] | None = None  # per draft layer, [1, kv_heads, C, head_dim] each
        self.seen = 0  # context tokens whose features are cached (positions 0 .. seen - 1 when none was skipped)
        self.fed = 0  # the context length at the last propose
        self.forwards = 0

    @torch.inference_mode()
    def propose(self, context: torch.Tensor, k: int) -> Draft:
        n = context.numel()
        self.fed = n
        m = min(k, self.length)
        if self.kv is None or m <= 0:
            return Draft.empty()  # no features yet: the first verification runs the prompt
        device, cfg = self.head.fc.weight.device, self.head.config
        ids = torch.full((1, m + 1), cfg.mask_token_id, dtype=torch.long, device=device)  # [1, 1 + m]
        ids[0, 0] = context[-1]
        positions = torch.arange(n - 1, n + m, device=device)[None]  # [1, 1 + m]
        out = self.head(self.embed(ids), positions, self.kv)  # [1, 1 + m, H]
        logits = self.lm_head(out[0, 1:].to(self.lm_head.weight.dtype)).float()  # [m, V]
        self.forwards += 1
        if self.cfg.greedy:  # left unread where it was drafted: the verification reads it with its verdict, the
            return Draft(logits.argmax(-1))  # step's one synchronisation on a GPU (issue #30)
        q = target_distribution(logits, self.cfg.temperature, self.cfg.top_k, self.cfg.top_p)  # [m, V]
        return Draft(torch.multinomial(q, 1, generator=self.generator).squeeze(-1), q)  # (unread, as above)

    @torch.inference_mode()
    def observe(self, verification: Verification) -> None:
        """Cache the features of the tokens the target fed and kept: the pending context, then the accepted drafts."""
        if not verification.layers:
            return
        rows = verification.layers[0].shape[0]
        pending = rows - (verification.logits.shape[0] - 1)  # P: context tokens this forward fed
        new = pending + verification.accepted
        start = self.fed - pending  # the position of the first one
        device = self.head.fc.weight.device
        fused = self.head.fuse([t[:new][None].to(device) for t in verification.layers])  # [1, new, H]
        kv = self.head.context(fused, torch.arange(start, start + new, device=device)[None])
        self.kv = kv if self.kv is None else [(torch.cat([a, k], 2), torch.cat([b, v], 2))
                                              for (a, b), (k, v) in zip(self.kv, kv, strict=True)]
        self.seen = start + new


@register_spec("spec.dflash", config=DFlashSpecConfig)
def run(model: CausalLM, batch: PromptBatch, cfg: DFlashSpecConfig, ctx: RunContext) -> Iterator[StepEvent]:
    """DFlash: a small non-causal drafter over the target's features fills a block of masks in one forward."""
    loaded: list[DFlashHead] = []

    def make(generator: torch.Generator | None) -> DFlashDrafter:
        if not loaded:  # after the driver's checks, once per run
            layer_list(model.model)  # a target whose layers cannot be read is refused here
            loaded.append(dflash_head(model, cfg.head))
        return DFlashDrafter(model, loaded[0], cfg, generator)

    return speculative(model, batch, cfg, ctx, make)
