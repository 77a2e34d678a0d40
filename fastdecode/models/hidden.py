"""Chosen decoder layers' outputs for `CausalLM.forward(..., hidden=(i, ...))`.

Trained accelerators read the target's intermediate features: EAGLE-3 fuses three layers (low, middle, high), DFlash
and Hidden Transfer read several. Layer `i` (0-based, negative from the end) is the output of decoder layer `i` as the
layer list runs, before the model's final norm: transformers' `output_hidden_states[i + 1]` for every layer but the
last, whose entry in that tuple transformers replaces by the normed `last_hidden_state` (that one is
`CausalOutput.hidden`). On transformers' forward the outputs are taken by forward hooks on the chosen layers, set for
one forward and always removed, so nothing is kept or run when no layer is asked.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from ..errors import IncompatibleMethodError, ParameterError

# where transformers keeps the decoder layers: Llama-like and hybrids, OPT, GPT-2/Falcon/Bloom, GPT-NeoX, Mamba
LAYER_PATHS = ("model.layers", "model.decoder.layers", "transformer.h", "gpt_neox.layers", "backbone.layers")


def decoder_layers(model: nn.Module) -> tuple[nn.Module, str] | None:
    """The module holding a transformers causal LM's decoder layers and the attribute name of their `nn.ModuleList`
    (spec.layerskip swaps that list), or None where they are in none of the known places."""
    for path in LAYER_PATHS:
        *parents, name = path.split(".")
        owner: object = model
        for attr in parents:
            owner = getattr(owner, attr, None)
        if isinstance(owner, nn.Module) and isinstance(getattr(owner, name, None), nn.ModuleList):
            return owner, name
    return None


def layer_list(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a transformers causal LM, in the order they run (read at call time, so a shortened
    list, as spec.layerskip's drafts use, is seen)."""
    found = decoder_layers(model)
    if found is None:
        raise IncompatibleMethodError(
            f"{type(model).__name__} keeps its decoder layers in none of the known places "
            f"({', '.join(LAYER_PATHS)}), so their outputs cannot be returned: ask for hidden=True (the last hidden "
            "states) instead."
        )
    return getattr(found[0], found[1])


def wanted(hidden: bool | Sequence[int], count: int) -> tuple[int, ...] | None:
    """`hidden` as non-negative layer indices (None: no layer asked); refuse anything but ints in [-count, count)."""
    if isinstance(hidden, bool):
        return None
    if isinstance(hidden, (str, bytes)) or not isinstance(hidden, Sequence):
        raise ParameterError(
            f"hidden={hidden!r}: pass False, True or a sequence of decoder layer indices, e.g. (2, -3)."
        )
    out = []
    for item in hidden:
        try:
            i = operator.index(item)  # ints, numpy and one-element integer tensors; not floats or strings
        except TypeError:
            i = None
        if i is None or isinstance(item, bool):
            raise ParameterError(f"hidden={tuple(hidden)!r}: layer indices must be integers, got {item!r}.")
        if not -count <= i < count:
            raise ParameterError(
                f"hidden={tuple(hidden)!r}: layer {i} does not exist; this model runs {count} decoder layers "
                f"(0 to {count - 1}, or -{count} to -1 from the end)."
            )
        out.append(i % count)
    return tuple(out)


@contextlib.contextmanager
def captured(layers: nn.ModuleList, indices: Sequence[int]) -> Iterator[list[torch.Tensor | None]]:
    """Record the outputs `[B, T, H]` of `layers[i]` for `i` in `indices` during the forward run inside the block;
    the list holds them in the order of `indices` once the block ends (None where a layer did not run)."""
    found: dict[int, torch.Tensor] = {}
    result: list[torch.Tensor | None] = [None] * len(indices)

    def keep(index: int):
        def hook(module: nn.Module, args: object, output: object) -> None:
            found[index] = output[0] if isinstance(output, (tuple, list)) else output  # type: ignore[assignment]
        return hook

    handles = [layers[i].register_forward_hook(keep(i)) for i in sorted(set(indices))]
    try:
        yield result
    finally:
        for handle in handles:
            handle.remove()
    result[:] = [found.get(i) for i in indices]


def collect(states: Sequence[torch.Tensor | None], indices: Sequence[int], name: str) -> tuple[torch.Tensor, ...]:
    """The captured outputs as a tuple; refuse a forward in which an asked layer did not run."""
    missing = [i for i, s in zip(indices, states, strict=True) if s is None]
    if missing:
        raise IncompatibleMethodError(f"{name!r}: decoder layers {missing} did not run in this forward, so their "
                                      "outputs cannot be returned.")
    return tuple(s for s in states if s is not None)
