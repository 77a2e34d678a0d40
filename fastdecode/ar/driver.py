"""The autoregressive driver: prefill once, then one forward per token with the KV cache."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ..cache import KVCache
from ..config import MethodConfig
from ..models.capabilities import attention_free
from ..models.causal import CausalLM
from ..sampling.pipeline import LogitsPipeline
from ..types import PromptBatch, StepEvent


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids `[B, L]` for a left-padded mask: 0 at each row's first real token."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def autoregressive(
    model: CausalLM, batch: PromptBatch, cfg: MethodConfig, generator: torch.Generator | None = None,
    constraint: Any = None, sparse: Any = None,
) -> Iterator[StepEvent]:
    """Every row's next token from the request's logits pipeline (`cfg`'s processors, argmax or a draw; the
    `constraint`'s grammar mask last); with `sparse` (a `fastdecode.sparse` rule) every forward reads the cached
    columns the rule selects."""
    device = model.device
    ids = batch.input_ids.to(device)  # [B, L]
    mask = batch.attention_mask.to(device)  # [B, L]
    B = batch.size
    eos = torch.tensor(sorted(model.eos_token_ids), dtype=torch.long, device=device)
    pipeline = LogitsPipeline.from_config(cfg, constraint=constraint)
    # what each row has seen (padding not counted), kept only when a processor reads it
    history = pipeline.history(ids, model.vocab_size, mask) if pipeline.uses_history or pipeline.stateful else None

    # A model without attention layers (Mamba, Mamba2) reads a mask only to zero the padding of the prompt: after
    # the prefill it gets none, as in transformers' generate() (Mamba's mixer would multiply the new token's hidden
    # state by a mask that covers the cached positions too, and broadcast it over all of them).
    decode_mask = not attention_free(model)
    cache = model.new_cache(batch=B, capacity=ids.shape[1] + cfg.max_new_tokens)
    # transformers' own cache needs the whole 2-D padding mask every step; the preallocated one keeps it per column
    growing = decode_mask and not isinstance(cache, KVCache)
    positions = positions_from_mask(mask)
    extra = {"sparse": sparse} if sparse is not None else {}  # adapters of one's own need not take it
    logits = model.forward(ids, positions, cache, mask, num_logits=1, **extra)[:, -1]  # [B, V]
    next_pos = positions[:, -1:] + 1  # [B, 1]
    done = torch.zeros(B, dtype=torch.bool, device=device)
    for step in range(cfg.max_new_tokens):
        token = pipeline.pick(logits, history.rows() if history is not None else None, generator)  # [B]
        token = torch.where(done, model.pad_token_id, token)
        active = (~done).tolist()
        done = done | torch.isin(token, eos)
        last = step == cfg.max_new_tokens - 1
        yield StepEvent(
            index=step,
            tokens=tuple(((step, t),) if a else () for t, a in zip(token.tolist(), active, strict=True)),
            finished=tuple(d or last for d in done.tolist()),
        )
        if last or bool(done.all()):
            return
        if history is not None:
            history.append(token)
        if growing:
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        logits = model.forward(token[:, None], next_pos, cache, mask if growing else None, **extra)[:, -1]
        next_pos = next_pos + 1
