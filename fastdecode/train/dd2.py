"""`fastdecode train dd2`: Distilled Decoding 2's one-step generator, trained by conditional score distillation.

DD2 has no public code (arXiv 2510.21003: the abstract, and docs/image-dd.md for what we chose). Our reading:

- **Generator G**: a `heads/dd.py` network read at t = 0 (all noise), one forward. Its output vector at position i is
  the regressed vector from `split` on and, before it, the logits' softmax-weighted mean of the codebook (a
  differentiable stand-in for the argmax code that sampling reads there). G starts from DD1's network (`--init`,
  default) or from the teacher.
- **Real conditional score, analytic**: G's output, quantised (the argmax / nearest code, as sampling does), is the
  prefix; one teacher forward on it gives p(q_i | c, q^_<i) at every i. Noised by x = x^ + sigma z, the teacher's
  distribution over codebook vectors becomes a Gaussian mixture whose denoiser is D_real = sum_k w_k e_k,
  w_k ∝ p_k N(x; e_k, sigma^2 I); the score is (D - x) / sigma^2. No gradient flows through the prefix.
- **Fake conditional score psi**: a copy of the teacher reading the same quantised prefix (so at initialisation its
  mixture denoiser equals the teacher's), plus a zero-initialised MLP correction over (hidden state, noisy vector,
  log sigma); trained by denoising score matching on G's (detached) outputs.
- **Update** (DMD-style, per position): G's loss 0.5 |x^ - sg(x^ - g)|^2 with g = (D_psi - D_real) / mean|x^ - D_real|
  (DMD's normalisation of the score difference), sigma log-uniform in [sigma_min, sigma_max]; `psi_steps` psi updates
  per G update, after `psi_warmup` updates of psi alone (so that psi follows G before G follows psi). AdamW on both.
  `norm` says over what the mean |x^ - D_real| runs: `sample` (every position and dimension of a row, as DMD does
  over an image) or `position` (each position's own d dimensions: the first shipped DD2's choice, which gives the
  positions where G already sits on a code a large weight).
- **Regression** (`reg_weight`, DMD's regression loss): optionally DD1's loss on the teacher's noise -> codes pairs
  at one step, added to G's loss, which anchors G to the teacher's map while the score term matches distributions.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ParameterError
from ..heads import load_head, save_head
from ..heads.dd import DDNet
from ..image.dd import dd_sample, noise
from .dd1 import dd1_loss, lr_at
from .ddstate import Report, clear_state, load_state, save_state, teacher_pairs

LOG = "train_log.jsonl"


@dataclass(frozen=True)
class DD2Training:
    """Every field settable with `--set NAME=VALUE`. The defaults are the shipped network's recipe (its card adds
    `--set pairs=80000`, DD1's pairs); the first recipe, which widened DD1's gap (docs/results/image/dd2-ablation/), is
    `--set norm=position --set psi_warmup=0 --set psi_steps=2 --set reg_weight=0 --set batch=32 --set warmup=20`."""

    steps: int = 1000  # generator updates (after psi's warm-up)
    psi_steps: int = 4  # psi updates per generator update
    batch: int = 16
    lr: float = 5e-5  # generator
    psi_lr: float = 2e-4
    warmup: int = 10
    sigma_min: float = 0.02
    sigma_max: float = 2.0
    checkpoint_every: int = 100
    eval_rows: int = 128  # rows for the card's teacher likelihood of samples
    norm: str = "sample"  # the mean |x^ - D_real| of DMD's normalisation: over a "sample" or each "position"
    psi_warmup: int = 100  # psi updates alone before the first generator update
    reg_weight: float = 0.25  # DMD's regression loss: DD1's one-step loss on the teacher's pairs, this weight
    pairs: int = 20000  # teacher (noise, codes) pairs for the regression loss (cached; see train/ddstate.py)
    map_steps: int = 12  # the map's RK4 steps for those pairs (as DD1's)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.psi_steps < 1 or self.batch < 1 or not 0 < self.sigma_min < self.sigma_max:
            raise ParameterError(f"need steps, psi_steps, batch >= 1 and 0 < sigma_min < sigma_max; got {self}")
        if self.norm not in ("sample", "position") or self.psi_warmup < 0 or self.reg_weight < 0 or self.pairs < 1:
            raise ParameterError(f"need norm sample|position, psi_warmup >= 0, reg_weight >= 0, pairs >= 1; got {self}")


def mixture_denoiser(logp: Tensor, codebook: Tensor, x: Tensor, sigma: Tensor) -> Tensor:
    """E[e | x] for e ~ sum_k p_k delta(e_k), x = e + sigma z. logp [B, n, K], x [B, n, d], sigma [B, n, 1]."""
    dist = torch.cdist(x.reshape(-1, 1, x.shape[-1]), codebook[None].expand(x.shape[0] * x.shape[1], -1, -1))
    dist = dist.reshape(*x.shape[:2], -1) ** 2  # [B, n, K]
    w = torch.softmax(logp - dist / (2 * sigma * sigma), dim=-1)
    return w @ codebook  # [B, n, d]


class ScoreNet(nn.Module):
    """psi: the teacher's copy over the quantised prefix, its mixture denoiser corrected by a zero-initialised MLP."""

    def __init__(self, teacher: Any, codes: int, width: int = 256) -> None:
        super().__init__()
        import copy

        # DD trains on the CPU (G and psi's head are built there), wherever the teacher runs
        self.lm = copy.deepcopy(teacher.model).float().cpu().train()
        self.codes = codes
        d = teacher.image.d
        hidden = teacher.config.hidden_size
        last = nn.Linear(width, d)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
        self.correct = nn.Sequential(nn.Linear(hidden + d + 1, width), nn.SiLU(), last)

    def prefix(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """ids [B, n + 1] (class + codes) -> (log p over codes [B, n, K], hidden [B, n, H]) for tokens 1..n."""
        out = self.lm(input_ids=ids[:, :-1], output_hidden_states=True)
        logp = torch.log_softmax(out.logits[..., : self.codes].float(), dim=-1)
        return logp, out.hidden_states[-1]

    def denoise(self, logp: Tensor, hidden: Tensor, codebook: Tensor, x: Tensor, sigma: Tensor) -> Tensor:
        base = mixture_denoiser(logp, codebook, x, sigma)
        return base + self.correct(torch.cat([hidden, x, torch.log(sigma)], dim=-1))


def generator_out(net: DDNet, labels: Tensor, eps: Tensor) -> tuple[Tensor, Tensor]:
    """G's differentiable output vectors [B, n, d] and its quantised codes [B, n] (what sampling returns)."""
    B, n, _ = eps.shape
    logits, vectors = net(labels, eps, torch.zeros(B, dtype=torch.long))
    soft = torch.softmax(logits, dim=-1) @ net.codebook  # [B, n, d]
    early = (torch.arange(n) < net.config.split)[None, :, None]
    out = torch.where(early, soft, vectors)
    return out, net.tokens_from(logits.detach(), vectors.detach())


@torch.no_grad()
def teacher_logp(teacher: Any, labels: Tensor, codes: Tensor) -> Tensor:
    """log p(q_i | c, q_<i) over codes, guided, teacher-forced on `codes`: [B, n, K], on the CPU (where DD trains),
    the teacher run on its own device (a GPU)."""
    ids = torch.cat([labels[:, None], codes], dim=1).to(teacher.device)  # [B, n + 1]
    positions = torch.arange(ids.shape[1] - 1, device=ids.device)[None].expand(ids.shape[0], -1)
    logits = teacher.forward(ids[:, :-1], positions)[..., : teacher.image.K].float()
    return torch.log_softmax(logits, dim=-1).cpu()


def sample_sigma(shape: tuple[int, ...], cfg: DD2Training, gen: torch.Generator) -> Tensor:
    u = torch.rand(shape, generator=gen)
    return torch.exp(math.log(cfg.sigma_min) + u * (math.log(cfg.sigma_max) - math.log(cfg.sigma_min)))


def nll_per_token(teacher: Any, labels: Tensor, codes: Tensor) -> float:
    """The teacher's mean negative log-likelihood per code of `codes` (mode collapse shows as too low a value)."""
    logp = teacher_logp(teacher, labels, codes)
    return float(-logp.gather(-1, codes[..., None]).mean())


def sample_nll(teacher: Any, net: DDNet, seed: int, rows: int) -> float:
    """The teacher's NLL per code of `rows` one-step samples drawn from their own seed: the card's claim."""
    image = teacher.image
    gen = torch.Generator().manual_seed(seed + 10_000)
    labels = image.K + torch.randint(image.C, (rows,), generator=gen)
    codes = dd_sample(net, labels, noise(rows, image.tokens, image.d, gen), 1)
    return nll_per_token(teacher, labels, codes)


def train_dd2(teacher: Any, out: Path, init: str | None = None, seed: int = 0, cfg: DD2Training | None = None,
              report: Report | None = None) -> dict[str, Any]:
    """Train DD2's generator against the guided image teacher into `out`; `init` a DD1 network folder (None: the
    teacher, with DD1's default split). Returns the card's numbers."""
    cfg = cfg or DD2Training()
    torch.manual_seed(seed)
    image = teacher.image
    if init:
        loaded = load_head(init, device="cpu", dtype=torch.float32)
        if not isinstance(loaded, DDNet):
            raise ParameterError(f"--init {init} holds a {loaded.kind!r} head, not a DD1 network")
        net = loaded
        net.config = dataclasses.replace(net.config, init="dd1", second=0)
    else:
        net = DDNet.for_target(teacher, split=round(0.3 * image.tokens), second=0, init="teacher",
                               cfg_scale=float(teacher.scale))
    net.train()
    psi = ScoreNet(teacher, image.K)
    codebook = net.codebook.detach()
    opt_g = torch.optim.AdamW(net.parameters(), lr=cfg.lr, betas=(0.0, 0.99), weight_decay=0.0)
    opt_p = torch.optim.AdamW(psi.parameters(), lr=cfg.psi_lr, betas=(0.0, 0.99), weight_decay=0.0)
    identity = {"kind": "dd2", "seed": seed, "init": init or "teacher", "training": dataclasses.asdict(cfg)}
    modules: dict[str, nn.Module] = {"net": net, "psi": psi}
    opts: dict[str, torch.optim.Optimizer] = {"net": opt_g, "psi": opt_p}
    record = load_state(out, modules, opts, identity) or {"step": 0, "log": [], "elapsed_s": 0.0}
    log: list[dict] = record["log"]
    began = time.perf_counter() - record["elapsed_s"]
    pairs = teacher_pairs(teacher, cfg.pairs, seed, cfg.map_steps) if cfg.reg_weight > 0 else None
    total = cfg.psi_warmup + cfg.steps
    for step in range(record["step"], total):
        gen = torch.Generator().manual_seed(seed * 7919 + step)  # every draw of a step from (seed, step): resumable
        g_step = step - cfg.psi_warmup  # < 0 while psi warms up alone
        for group in opt_g.param_groups:
            group["lr"] = lr_at(max(g_step, 0), cfg)
        metrics = _step(teacher, net, psi, codebook, opt_g, opt_p, cfg, gen, pairs, g_step >= 0)
        log.append({"step": step, **{k: round(v, 5) for k, v in metrics.items()}})
        if report is not None:
            report("train", step + 1, total, metrics)
        if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < total:
            save_state(out, modules, opts, {"identity": identity, "step": step + 1, "log": log,
                                            "elapsed_s": time.perf_counter() - began})
    train_s = time.perf_counter() - began
    save_head(net.eval(), out, dtype="bfloat16")
    shipped = load_head(out, device="cpu", dtype=torch.float32)  # the card measures what ships (bfloat16 weights)
    assert isinstance(shipped, DDNet)
    card = {"kind": "dd2", "seed": seed, "init": init or "teacher", "training": dataclasses.asdict(cfg),
            "train_s": round(train_s, 1), "final": log[-1] if log else None,
            "teacher_nll_per_token": round(sample_nll(teacher, shipped, seed, cfg.eval_rows), 4)}
    (out / LOG).write_text("".join(json.dumps(row) + "\n" for row in log))
    clear_state(out)
    return card


def _step(teacher: Any, net: DDNet, psi: ScoreNet, codebook: Tensor, opt_g: torch.optim.Optimizer,
          opt_p: torch.optim.Optimizer, cfg: DD2Training, gen: torch.Generator,
          pairs: tuple[Tensor, Tensor, Tensor] | None = None, update_g: bool = True) -> dict[str, float]:
    """psi_steps updates of psi on fresh G samples, then (`update_g`) one update of G; the losses as metrics."""
    image = teacher.image
    psi_loss = torch.zeros(())
    for _ in range(cfg.psi_steps if update_g else 1):
        labels = image.K + torch.randint(image.C, (cfg.batch,), generator=gen)
        with torch.no_grad():
            x0, q = generator_out(net, labels, noise(cfg.batch, image.tokens, image.d, gen))
        sigma = sample_sigma((cfg.batch, image.tokens, 1), cfg, gen)
        xs = x0 + sigma * torch.randn(x0.shape, generator=gen)
        logp, hidden = psi.prefix(torch.cat([labels[:, None], q], dim=1))
        psi_loss = ((psi.denoise(logp, hidden, codebook, xs, sigma) - x0) ** 2).sum(-1).mean()
        opt_p.zero_grad(set_to_none=True)
        psi_loss.backward()
        torch.nn.utils.clip_grad_norm_(psi.parameters(), 1.0)
        opt_p.step()
    if not update_g:
        return {"loss": 0.0, "psi": float(psi_loss.detach()), "gap": 0.0, "reg": 0.0}
    labels = image.K + torch.randint(image.C, (cfg.batch,), generator=gen)
    x0, q = generator_out(net, labels, noise(cfg.batch, image.tokens, image.d, gen))
    sigma = sample_sigma((cfg.batch, image.tokens, 1), cfg, gen)
    with torch.no_grad():
        xs = x0 + sigma * torch.randn(x0.shape, generator=gen)
        real = mixture_denoiser(teacher_logp(teacher, labels, q), codebook, xs, sigma)
        logp, hidden = psi.prefix(torch.cat([labels[:, None], q], dim=1))
        fake = psi.denoise(logp, hidden, codebook, xs, sigma)
        over = (1, 2) if cfg.norm == "sample" else (2,)
        scale = (x0 - real).abs().mean(over, keepdim=True).clamp_min(1e-4)  # [B, 1, 1] or [B, n, 1]
        grad = (fake - real) / scale
    g_loss = 0.5 * ((x0 - (x0 - grad).detach()) ** 2).sum(-1).mean()
    reg = torch.zeros(())
    if pairs is not None:
        idx = torch.randint(pairs[0].shape[0], (cfg.batch,), generator=gen)
        reg, _ = dd1_loss(net, pairs[0][idx], pairs[1][idx], pairs[2][idx], torch.zeros(cfg.batch, dtype=torch.long),
                          1.0)
    opt_g.zero_grad(set_to_none=True)
    (g_loss + cfg.reg_weight * reg).backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    opt_g.step()
    gap = float((fake - real).norm(dim=-1).mean())
    return {"loss": float(g_loss.detach()), "psi": float(psi_loss.detach()), "gap": gap, "reg": float(reg.detach())}
