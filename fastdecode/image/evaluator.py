"""The evaluator: a small digit classifier whose penultimate features score generated images.

Trained once on the MNIST-5k train split (`fastdecode train img-eval`) and never used in any training loop, so that
what it says about a method's samples is not something a generator was fitted to. Its 64-d penultimate activations
are the feature space of the Fréchet distance, KID and precision/recall (`metrics.py`); its logits give the class
accuracy of the samples. Images of any size are resized to 28x28, so the 8x8 test fixture can be scored too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from ..errors import FastDecodeError

SIDE = 28  # the evaluator's input side, MNIST's
WEIGHTS = "model.safetensors"
CONFIG = "evaluator.json"  # not config.json: the folder is not a language model, and zoo_names() lists only those


class EvaluatorError(FastDecodeError, ValueError):
    """An evaluator folder that cannot be loaded, or images it cannot score."""


@dataclass(frozen=True)
class EvaluatorConfig:
    channels: tuple[int, int, int] = (16, 32, 64)
    features: int = 64  # the penultimate width: the metrics' feature dimension
    classes: int = 10


class DigitCNN(nn.Module):
    """Three 3x3 conv blocks, a 3x3 average pool, a 64-d feature layer and a linear classifier (~62 k parameters)."""

    def __init__(self, cfg: EvaluatorConfig = EvaluatorConfig()) -> None:
        super().__init__()
        c1, c2, c3 = cfg.channels
        self.cfg = cfg
        self.conv1 = nn.Conv2d(1, c1, 3, padding=1)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.conv3 = nn.Conv2d(c2, c3, 3, padding=1)
        self.feature = nn.Linear(c3 * 9, cfg.features)
        self.head = nn.Linear(cfg.features, cfg.classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, 1, 28, 28] in [0, 1] -> penultimate activations [B, F]."""
        h = F.max_pool2d(F.relu(self.conv1(x)), 2)  # [B, c1, 14, 14]
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)  # [B, c2, 7, 7]
        h = F.adaptive_avg_pool2d(F.relu(self.conv3(h)), 3)  # [B, c3, 3, 3]
        return F.relu(self.feature(h.flatten(1)))  # [B, F]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))  # [B, classes]


def to_input(images: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 images [B, H, W] (any H, W) -> float [B, 1, 28, 28] in [0, 1]."""
    x = torch.as_tensor(np.asarray(images))
    if x.ndim != 3:
        raise EvaluatorError(f"Images must be a [B, H, W] array of grey levels, not shape {tuple(x.shape)}.")
    x = x.float().unsqueeze(1) / 255.0  # [B, 1, H, W]
    if x.shape[-2:] != (SIDE, SIDE):
        x = F.interpolate(x, size=(SIDE, SIDE), mode="bilinear", align_corners=False)
    return x


@dataclass(frozen=True)
class Scores:
    """What the evaluator says about a set of images."""

    features: np.ndarray  # float64 [N, F]
    predicted: np.ndarray  # int64 [N]


class Evaluator:
    """A trained DigitCNN in eval mode, float32 on CPU, scoring uint8 images in batches."""

    def __init__(self, net: DigitCNN) -> None:
        self.net = net.float().eval()

    @torch.no_grad()
    def score(self, images: np.ndarray, batch: int = 256) -> Scores:
        feats, preds = [], []
        for start in range(0, len(images), batch):
            h = self.net.features(to_input(images[start:start + batch]))  # [b, F]
            feats.append(h.double().numpy())
            preds.append(self.net.head(h).argmax(-1).numpy())
        if not feats:
            return Scores(np.zeros((0, self.net.cfg.features)), np.zeros(0, dtype=np.int64))
        return Scores(np.concatenate(feats), np.concatenate(preds).astype(np.int64))

    def accuracy(self, images: np.ndarray, labels: np.ndarray) -> float:
        return float((self.score(images).predicted == np.asarray(labels)).mean())


def default_folder() -> Path:
    """The shipped evaluator: fastdecode/zoo/img-eval (beside the zoo models, though not one of them)."""
    return Path(__file__).resolve().parent.parent / "zoo" / "img-eval"


def save_evaluator(net: DigitCNN, folder: Path) -> None:
    """bfloat16 safetensors and the config; the card is written by the training command."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().to(torch.bfloat16).contiguous() for k, v in net.state_dict().items()},
              str(folder / WEIGHTS))
    (folder / CONFIG).write_text(json.dumps(asdict(net.cfg), indent=1) + "\n", encoding="utf-8")


def load_evaluator(folder: str | Path | None = None) -> Evaluator:
    """The evaluator in `folder` (default: the shipped one), float32."""
    path = Path(folder) if folder is not None else default_folder()
    if not (path / WEIGHTS).is_file() or not (path / CONFIG).is_file():
        raise EvaluatorError(f"No evaluator in {path} (it needs {WEIGHTS} and {CONFIG}): train it with "
                             "`fastdecode train img-eval` (needs the image extra: pip install 'fastdecode[image]').")
    raw = json.loads((path / CONFIG).read_text(encoding="utf-8"))
    cfg = EvaluatorConfig(channels=tuple(raw["channels"]), features=raw["features"], classes=raw["classes"])
    net = DigitCNN(cfg)
    net.load_state_dict({k: v.float() for k, v in load_file(str(path / WEIGHTS)).items()})
    return Evaluator(net)
