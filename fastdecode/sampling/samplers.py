"""Logits -> tokens. Sampling always takes an explicit torch.Generator so runs repeat."""

from __future__ import annotations

import torch

from ..errors import ParameterError
from ..models.base import on_host


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """`[B, V]` -> `[B]` argmax (ties go to the lowest id, as torch.argmax does)."""
    return logits.argmax(dim=-1)


def sample(logits: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """`[B, V]` -> `[B]` one draw from softmax(logits) per row."""
    probs = logits.float().softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def make_generator(seed: int | None, given: torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """The caller's generator wins (it must live on the model's device: torch draws on the logits' device); else a
    fresh one from `seed` on `device`; else None (torch's global RNG)."""
    if given is not None:
        if given.device.type != torch.device(device).type:
            raise ParameterError(
                f"generator= is on {given.device} but the model is on {device}: make it there, "
                f"torch.Generator(device=model.device).manual_seed(...), or pass seed= instead."
            )
        return given
    if seed is None:
        return None
    return torch.Generator(device=device).manual_seed(seed)


def host_generator(generator: torch.Generator | None) -> torch.Generator | None:
    """A generator for draws a method makes in host memory (a few rows of distributions, an image's noise): the run's
    own where it lives there; a run's generator on a device seeds a host one from its own stream (one draw), so that
    seeded runs repeat and a generator passed again draws anew, as it does on the host; None stays None (torch's
    global RNG)."""
    if generator is None or on_host(generator.device):
        return generator
    seed = int(torch.randint(2**62, (1,), generator=generator, device=generator.device))
    return torch.Generator().manual_seed(seed)
