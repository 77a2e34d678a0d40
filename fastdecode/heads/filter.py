"""Learn2PD's filter (Bao et al. 2025, arXiv 2509.25188): a tiny MLP that reads a block of a masked-diffusion
canvas and says, per position, whether the model's current prediction there is already the token the run will end
with, so it can be committed now instead of being re-predicted step after step.

The paper's filter reads the block's confidence vector (a 2-layer MLP of about 2 k parameters). `History.features`
computes four features per position of a block of `width` positions (`FEATURES`): the prediction's confidence, the
confidence it had at the previous step, how many steps in a row the prediction has stayed the same, and whether the
position is already committed; a filter reads the ones its config names (default: the confidence and the committed
flag, the paper's input: the history features measured worse on zoo:dlm-small, docs/diffusion.md). The trajectories
it is trained on (`train/filter.py`) and the decoding that uses it (`diffusion/policies/learn2pd.py`) compute them
with the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .base import Head, HeadConfig, Target, register_head

FEATURES = ("conf", "prev_conf", "streak", "committed")
STREAK_CAP = 8  # the streak feature counts steps up to this many, scaled to [0, 1]


@dataclass(frozen=True)
class FilterConfig(HeadConfig):
    width: int = 16  # positions of a block the filter reads and judges at once (blocks of the decoding)
    hidden: int = 32  # units of the one hidden layer
    features: tuple[str, ...] = ("conf", "committed")  # what it reads, of the FEATURES `History.features` computes


@register_head("learn2pd")
class FilterHead(Head):
    """`[R, width, F]` features -> `[R, width]` logits of "this position's prediction is final"."""

    config_class = FilterConfig

    def __init__(self, config: FilterConfig, target: Target | None = None) -> None:
        super().__init__(config, target)
        unknown = [f for f in config.features if f not in FEATURES]
        if unknown or not config.features:
            raise ValueError(f"filter features {list(config.features)}: choose some of {', '.join(FEATURES)}")
        self.picked: torch.Tensor
        self.register_buffer("picked", torch.tensor([FEATURES.index(f) for f in config.features]), persistent=False)
        inputs = config.width * len(config.features)
        self.hidden = nn.Linear(inputs, config.hidden)
        self.out = nn.Linear(config.hidden, config.width)

    @property
    def spec(self) -> FilterConfig:
        """The config, typed as this kind's."""
        assert isinstance(self.config, FilterConfig)
        return self.config

    def forward(self, feats: torch.Tensor) -> torch.Tensor:  # [R, W, F] -> [R, W]
        x = feats[..., self.picked].flatten(1).to(self.hidden.weight.dtype)  # [R, W * F']
        return self.out(torch.relu(self.hidden(x))).float()

    @classmethod
    def for_target(cls, model: Any, **options: Any) -> FilterHead:
        return cls(FilterConfig(**options), Target.of(model))

    @classmethod
    def untrained(cls, model: Any, seed: int = 0) -> FilterHead:
        gen = torch.Generator().manual_seed(seed)
        head = cls(FilterConfig())
        with torch.no_grad():
            for p in head.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
        return head.eval()


class History:
    """Per batch row and generated offset `[B, N]`: the confidence and prediction the position had the last time a
    step saw it, and how many steps in a row its prediction has not changed (0 = never seen)."""

    def __init__(self, rows: int, n: int, device: torch.device) -> None:
        self.conf = torch.zeros(rows, n, dtype=torch.float64, device=device)
        self.x0 = torch.full((rows, n), -1, dtype=torch.long, device=device)
        self.streak = torch.zeros(rows, n, dtype=torch.long, device=device)

    def features(self, rows: torch.Tensor, cols: torch.Tensor, inview: torch.Tensor, masked: torch.Tensor,
                 x0: torch.Tensor, conf: torch.Tensor, width: int) -> torch.Tensor:
        """This step's features `[R, width, F]` for view columns `cols` `[R, W]` (offsets) of `rows` `[R]`, and the
        history advanced by it. Committed and padding columns read (1, 1, 1, 1): settled; W <= width."""
        r = rows[:, None].expand_as(cols)  # [R, W]
        conf = conf.clamp(min=0.0)  # -inf off the masked positions
        same = (self.x0[r, cols] == x0) & masked
        streak = torch.where(same, self.streak[r, cols] + 1, torch.ones_like(cols)) * masked  # [R, W]
        prev = self.conf[r, cols]  # [R, W]
        upd = inview & masked
        self.conf[r[upd], cols[upd]] = conf[upd]
        self.x0[r[upd], cols[upd]] = x0[upd]
        self.streak[r[upd], cols[upd]] = streak[upd]
        return assemble(conf, prev, streak, masked, width)


def assemble(conf: torch.Tensor, prev: torch.Tensor, streak: torch.Tensor, masked: torch.Tensor,
             width: int) -> torch.Tensor:
    """`[R, W]` per-feature tensors -> `[R, width, F]` float32 features, settled values off `masked` and on the
    padding columns past W."""
    settled = ~masked
    feats = torch.stack([
        torch.where(settled, 1.0, conf.double()),
        torch.where(settled, 1.0, prev.double()),
        torch.where(settled, 1.0, streak.clamp(max=STREAK_CAP).double() / STREAK_CAP),
        settled.double(),
    ], dim=-1).float()  # [R, W, F]
    W = feats.shape[1]
    if W > width:
        raise ValueError(f"a view of {W} columns is wider than the filter's {width}")
    return nn.functional.pad(feats, (0, 0, 0, width - W), value=1.0)
