"""What every model adapter shares: the wrapped module, tokenizer, special tokens, limits."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
from transformers import PreTrainedConfig

from ..errors import PromptError
from ..types import ModelKind

if TYPE_CHECKING:
    from .image import ImageSpec


_HOST = torch.device("cpu")


def on_host(device: torch.device) -> bool:
    """Whether a tensor or generator on `device` lives in host memory: the CPU, whose tensors always say `cpu`. (The
    test suite's simulated device, tests/device_sim.py, is the CPU under the name `cpu:0`: a device, as a GPU is.)"""
    return device == _HOST


def _as_id_set(value: Any) -> frozenset[int]:
    if value is None:
        return frozenset()
    if isinstance(value, int):
        return frozenset([value])
    return frozenset(int(v) for v in value)


class ModelAdapter:
    """Base of the causal and masked-diffusion adapters. Only drivers call `forward`."""

    kind: ModelKind  # "causal" or "diffusion": each subclass sets it
    image: ImageSpec | None = None  # an image model's layout and codec (models/image.py); None for text models

    def __init__(self, model: torch.nn.Module, tokenizer: Any = None, name: str = "") -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = cast(PreTrainedConfig, model.config)  # torch types module attributes as Tensor | Module
        self.name = name or getattr(self.config, "_name_or_path", "") or type(model).__name__

    # -- properties -------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def max_positions(self) -> int | None:
        for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
            value = getattr(self.config, key, None)
            if isinstance(value, int) and value > 0:
                return value
        return None

    @property
    def eos_token_ids(self) -> frozenset[int]:
        gen = getattr(self.model, "generation_config", None)
        ids = _as_id_set(getattr(gen, "eos_token_id", None)) | _as_id_set(getattr(self.config, "eos_token_id", None))
        if not ids and self.tokenizer is not None:
            ids = _as_id_set(self.tokenizer.eos_token_id)
        return ids

    @property
    def pad_token_id(self) -> int:
        for source in (self.config, self.tokenizer):
            value = getattr(source, "pad_token_id", None)
            if isinstance(value, int):
                return value
        return min(self.eos_token_ids, default=0)

    # -- text ------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise PromptError(
                f"Model {self.name!r} has no tokenizer, so text prompts cannot be encoded: "
                "pass token ids, or put tokenizer files (tokenizer.json) in the model folder."
            )
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return " ".join(map(str, ids))
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "architecture": type(self.model).__name__,
            "parameters": self.num_parameters,
            "vocab_size": self.vocab_size,
            "max_positions": self.max_positions,
            "eos_token_ids": sorted(self.eos_token_ids),
            "pad_token_id": self.pad_token_id,
            "dtype": str(self.dtype).removeprefix("torch."),
            "device": str(self.device),
        }
