"""`dflash` head objective: DFlash's block training (SpecForge's DFlash family, the authors' recipe).

Each sequence gets up to `anchors` random anchor positions on its answer. A block is [the anchor's token,
mask x (B - 1)] at the anchor's positions; block position k learns the token k after the anchor. Every block reads
the fused target features of the context strictly before its anchor (at decoding time the last verified token's own
features do not exist yet) and sees itself bidirectionally, never another block; all blocks of a batch run in one
forward. The loss is cross-entropy on the target's own tokens (self-distilled answers), weighted exp(-(k - 1)/gamma)
so that early positions, which gate acceptance of everything after them, count most.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from ...heads.dflash import DFlashHead, build_for, config_for, target_parts
from .base import HeadObjective, TargetBatch

SHAPE = ("target_layers", "num_layers", "block_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim",
         "mask_token_id")
TRAINING = {"anchors": 32, "gamma": 4.0}  # anchors per sequence; the loss decay over block positions


def _value(value: Any) -> Any:
    """A `--set` value: tuples stay, "1,3,5" becomes (1, 3, 5), numbers stay numbers."""
    if isinstance(value, str) and "," in value:
        return tuple(int(v) for v in value.split(",") if v.strip())
    if isinstance(value, list):
        return tuple(value)
    return value


def shape_options(options: dict[str, Any]) -> dict[str, Any]:
    """The head-shape fields among the command's options (`layers` is accepted for `target_layers`)."""
    known = set(SHAPE) | set(TRAINING) | {"layers"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"unknown dflash option(s) {unknown}: use {', '.join(sorted(known))}")
    found = {k: _value(v) for k, v in options.items() if k in SHAPE}
    if "layers" in options:
        found["target_layers"] = _value(options["layers"])
    if isinstance(found.get("target_layers"), int):
        found["target_layers"] = (found["target_layers"],)
    return {k: int(v) if isinstance(v, (str, float)) else v for k, v in found.items()}


def sample_anchors(answer: torch.Tensor, count: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`[B, T]` answer mask -> anchors `[B, N]` (sorted, 0 where unused) and `[B, N]` keep: up to `count` random
    positions per row whose token and next token are both answer tokens."""
    valid = answer[:, :-1] & answer[:, 1:]  # [B, T - 1]
    width = max(1, min(count, int(valid.sum(1).max())))
    noise = torch.rand(valid.shape, generator=gen, device=gen.device).to(answer.device)
    picked = noise.masked_fill(~valid, 2.0).argsort(1)[:, :width]  # [B, N]
    keep = torch.arange(width, device=answer.device)[None] < valid.sum(1, keepdim=True).clamp(max=width)
    anchors = torch.where(keep, picked, torch.full_like(picked, valid.shape[1])).sort(1).values
    keep = anchors < valid.shape[1]
    return torch.where(keep, anchors, 0), keep


def block_mask(anchors: torch.Tensor, attention: torch.Tensor, block: int) -> torch.Tensor:
    """`[B, N]` anchors, `[B, T]` real tokens -> `[B, N*block, T + N*block]` bool: a block's queries read the real
    context strictly before their anchor and every position of their own block."""
    B, N = anchors.shape
    T = attention.shape[1]
    anchor = anchors.repeat_interleave(block, 1)  # [B, Q]
    ctx = (torch.arange(T, device=anchors.device)[None, None] < anchor[..., None]) & attention[:, None]  # [B, Q, T]
    ids = torch.arange(N * block, device=anchors.device) // block  # [Q] the block of each query
    own = (ids[:, None] == ids[None]).expand(B, -1, -1)  # [B, Q, Q]
    return torch.cat([ctx, own], dim=-1)


class DFlashObjective(HeadObjective):
    kind = "dflash"
    method = "spec.dflash"  # the method the loop measures the trained head with, for its card

    def card_lines(self, options: dict[str, Any]) -> list[str]:
        """How the head is shaped and trained, for its card."""
        training = {**TRAINING, **{k: options[k] for k in TRAINING if k in options}}
        return [f"DFlash block drafter (z-lab/dflash; SpecForge's DFlash training): {training['anchors']} random "
                "anchors per sequence, each block [anchor token, masks] reading the fused target features of the "
                "context strictly before its anchor and itself bidirectionally; cross-entropy on the target's own "
                f"tokens weighted exp(-(k-1)/{training['gamma']}) over block position k.", ""]

    def target_layers(self, target: Any, options: dict[str, Any]) -> tuple[int, ...]:
        return config_for(target, **shape_options(options)).target_layers

    def build_head(self, target: Any, options: dict[str, Any]) -> DFlashHead:
        head = build_for(target, **shape_options(options))
        # how it is trained (not its shape, so not in its config): read back by head_loss
        head.training_options = {k: type(v)(options.get(k, v)) for k, v in TRAINING.items()}
        return head

    def head_loss(self, head: DFlashHead, target: Any, batch: TargetBatch,
                  gen: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        cfg, Bk = head.config, head.config.block_size
        options: dict[str, Any] = {**TRAINING, **head.training_options}
        anchors_per_row, gamma = int(options["anchors"]), float(options["gamma"])
        ids, attention, answer = batch.ids, batch.attention.bool(), batch.answer.bool()  # [B, T]
        B, T = ids.shape
        device: torch.device = head.fc.weight.device
        anchors, keep = sample_anchors(answer, anchors_per_row, gen)  # [B, N]
        N = anchors.shape[1]
        offsets = torch.arange(Bk, device=ids.device)  # [Bk]
        where = anchors[..., None] + offsets  # [B, N, Bk] the position of each block slot
        embed, lm_head = target_parts(target)
        with torch.no_grad():
            block_ids = torch.full((B, N, Bk), cfg.mask_token_id, dtype=torch.long, device=ids.device)
            block_ids[..., 0] = ids.gather(1, anchors)
            noise = embed(block_ids.view(B, N * Bk).to(next(embed.parameters()).device)).clone()  # [B, Q, H]
        fused = head.fuse([t.clone().to(device) for t in batch.layers])  # [B, T, H]
        context = head.context(fused, torch.arange(T, device=device).expand(B, T))
        visible = block_mask(anchors, attention, Bk).to(device)
        out = head(noise.to(device), where.view(B, N * Bk).to(device), context, visible)  # [B, Q, H]
        # labels: slot k learns the token k after the anchor, on answer tokens inside the row, slot 0 never
        inside = where < T
        labels = ids.gather(1, where.clamp(max=T - 1).view(B, -1)).view(B, N, Bk)
        learn = keep[..., None] & inside & answer.gather(1, where.clamp(max=T - 1).view(B, -1)).view(B, N, Bk)
        learn[..., 0] = False
        decay = torch.exp(-(offsets - 1).clamp(min=0).float() / gamma).to(device)  # [Bk]
        weight = learn.to(device).float() * decay  # [B, N, Bk]
        picked = learn.view(-1).to(device)
        logits = F.linear(out.reshape(-1, out.shape[-1])[picked].to(lm_head.weight.dtype),
                          lm_head.weight.detach()).float()  # [M, V]
        ce = F.cross_entropy(logits, labels.view(-1).to(device)[picked], reduction="none")  # [M]
        loss = (ce * weight.view(-1)[picked]).sum() / weight.sum().clamp(min=1e-9)
        return loss, _metrics(loss, logits, labels.to(device), learn.to(device), picked)


def _metrics(loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor, learn: torch.Tensor,
             picked: torch.Tensor) -> dict[str, float]:
    """Per draft position accuracy (`acc0` = the first masked slot) and the acceptance length a chain verifier
    would get on these blocks, tau = 1 + E[accepted prefix] (blocks cut by the row's end count what they hold)."""
    with torch.no_grad():
        right = torch.zeros_like(learn)
        right.view(-1)[picked] = logits.argmax(-1) == labels.view(-1)[picked]
        found: dict[str, float] = {"loss": float(loss)}
        for k in range(1, learn.shape[-1]):
            n = int(learn[..., k].sum())
            found[f"acc{k - 1}"] = float((right[..., k] & learn[..., k]).sum()) / n if n else math.nan
        blocks = learn[..., 1]  # [B, N] blocks with at least one label
        prefix = (right[..., 1:] & learn[..., 1:]).long().cumprod(-1).sum(-1)  # [B, N]
        found["tau"] = 1.0 + float(prefix[blocks].float().mean()) if bool(blocks.any()) else math.nan
    return found
