"""LAVE's beam lookahead (`Constraint(lave_search="beam")`), as the authors' `validate` runs it
(zhangyitonggg/CD4dLLM): the masks between the frontier and the last committed position are filled left to right;
at each mask every kept filling is extended by the `top_k` likeliest tokens there (scored by the sum of their
probabilities), the `width` best extensions are kept plus `random` others drawn at random; at each committed
position the fillings whose text the grammar cannot extend are dropped. The proposal passes when one survives, and
the best-scoring survivor is the new witness.
"""

from __future__ import annotations

from typing import Any

import torch

Beam = tuple[list[int], float]


def beam_lookahead(proc: Any, state: Any, canvas: list[int], f: int, lo: int, logits: torch.Tensor, mask_id: int,
                   eos: frozenset[int], shape: tuple[int, int, int],
                   generator: torch.Generator | None) -> list[int] | None:
    """A filling of `canvas`'s masks in [f, last committed] that the grammar (`proc` from `state`) can extend, or
    None. `logits` `[W, V]` are the row's view logits (view starting at generated offset `lo`); `shape` is
    (top_k, width, random)."""
    committed = [p for p in range(f, len(canvas)) if canvas[p] != mask_id]
    if not committed:
        return canvas[:f]
    last = committed[-1]
    top_k, width, random = shape
    beams: list[Beam] = [(list(canvas[: last + 1]), 0.0)]
    for p in range(f, last + 1):
        if canvas[p] == mask_id:
            if not 0 <= p - lo < logits.shape[0]:
                return None  # a mask outside the view: no distribution to fill it from
            beams = _extend(beams, p, logits[p - lo].double().softmax(-1), top_k, width, random, generator)
            continue
        beams = [b for b in beams if _valid(proc, state, b[0][f : p + 1], eos)]
        if not beams:
            return None
        if canvas[p] in eos:
            break
    return max(beams, key=lambda b: b[1])[0]


def _extend(beams: list[Beam], p: int, probs: torch.Tensor, top_k: int, width: int, random: int,
            generator: torch.Generator | None) -> list[Beam]:
    values, ids = probs.topk(min(top_k, probs.shape[-1]))
    grown = [(seq[:p] + [t] + seq[p + 1 :], score + v)
             for seq, score in beams for v, t in zip(values.tolist(), ids.tolist(), strict=True) if v > 0]
    grown.sort(key=lambda b: -b[1])
    kept, rest = grown[:width], grown[width:]
    if rest and random:
        picks = torch.randperm(len(rest), generator=generator)[:random].tolist()
        kept += [rest[k] for k in sorted(picks)]
    return kept


def _valid(proc: Any, state: Any, region: list[int], eos: frozenset[int]) -> bool:
    """Whether the grammar can extend `region` (through its first EOS, which must then end a sentence)."""
    end = next((k + 1 for k, t in enumerate(region) if t in eos), len(region))
    return bool(proc.valid_prefix(state, region[:end]) == end)
