"""The drafter of Speculative Jacobi Decoding (Teng et al. 2024, arXiv 2410.01699), shared by spec.sjd and the lossy
acceptance variants over its drafts (spec.lantern, spec.gsd).

A window of L guesses follows the accepted prefix. Each verification forward scores them all; the positions after
the emitted token are redrafted from the target's new distributions there (the Jacobi update, sampled instead of
argmax'd), and each draft carries q, the processed distribution it was drawn from, so that the driver's speculative
sampling (accept w.p. min(1, p/q), resample from max(p - q, 0)) keeps the output distributed as ar.sample's.
New positions at the end of the window are initialised either uniformly at random (q uniform over the tokens the
model may generate) or, on an image model, by repeating the token one grid row above (q one-hot), SJD's best
initialisation (the authors' `repeat_horizon`, their Fig. 9).

`coupling=True` is MC-SJD's redraft (maximal coupling): a position that already held a draft keeps it with
probability min(1, p_new(x) / q_old(x)), else takes a draw from norm(max(p_new - q_old, 0)); either way the new
draft is distributed as p_new, so q = p_new and the verification is unchanged, but drafts move less between
iterations, which is what lets them converge.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import IncompatibleMethodError
from ..models.causal import CausalLM
from ..sampling.samplers import host_generator
from .drafter import BaseDrafter, Draft, SpecConfig, Verification
from .verify import target_distribution

INITS = ("auto", "random", "vertical")


class JacobiWindow(BaseDrafter):
    """One row's SJD window: guesses, the distributions they were drawn from, and how new positions start."""

    def __init__(self, cfg: SpecConfig, window: int, init: str, coupling: bool, *, vocab: int,
                 allowed: int | None = None, grid_width: int | None = None,
                 generator: torch.Generator | None = None, device: torch.device | None = None) -> None:
        self.cfg, self.window, self.coupling = cfg, window, coupling
        self.device = device if device is not None else torch.device("cpu")  # where the target's p lives
        self.vocab = vocab
        self.allowed = allowed if allowed is not None else vocab  # tokens 0..allowed-1 may be generated
        self.width = grid_width
        self.init = ("vertical" if grid_width else "random") if init == "auto" else init
        if self.init == "vertical" and not grid_width:
            raise IncompatibleMethodError(
                "init='vertical' repeats the token one image row above, but this model has no image grid (a text "
                "model). Use init='random' (or 'auto') with text models."
            )
        self.generator = host_generator(generator)  # it draws on host copies of a few rows of V
        self.sampling = cfg.temperature > 0
        self.start: int | None = None  # the prompt length: where generated tokens begin
        self.guess: list[int] = []  # guesses carried over from the last verification
        self.guess_q: torch.Tensor | None = None  # [len(guess), V] their distributions (sampling only)
        self.last = Draft.empty()  # the draft last proposed (what the verification's rows refer to)

    def _uniform(self) -> torch.Tensor:
        q = torch.zeros(self.vocab)
        q[: self.allowed] = 1.0 / self.allowed
        return q  # [V]

    def _fresh(self, seq: list[int]) -> tuple[int, torch.Tensor | None]:
        """The token for the position after `seq` (context + guesses so far) and its q (None when greedy)."""
        assert self.start is not None
        made = len(seq) - self.start  # generated index of the new position
        if self.init == "vertical" and self.width is not None and made >= self.width:
            token = seq[-self.width]
            if not self.sampling:
                return token, None
            q = torch.zeros(self.vocab)
            q[token] = 1.0
            return token, q
        if not self.sampling:  # greedy: any guess is verified exactly; repeat the last token, as spec.jacobi
            return seq[-1], None
        q = self._uniform()
        return int(torch.multinomial(q, 1, generator=self.generator)), q

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        if self.start is None:
            self.start = context.numel()
        m = min(k, self.window)
        tokens = self.guess[:m]
        qs = list(self.guess_q[: len(tokens)]) if self.guess_q is not None else []
        seq = context.tolist() + tokens
        while len(tokens) < m:
            token, q = self._fresh(seq)
            tokens.append(token)
            seq.append(token)
            if q is not None:
                qs.append(q)
        ids = torch.tensor(tokens, dtype=torch.long)  # [m]
        self.last = Draft(ids, torch.stack(qs).to(self.device) if self.sampling and qs else None)
        return self.last

    def reads(self, logits: torch.Tensor, num_draft: int, hidden: torch.Tensor | None = None
              ) -> torch.Tensor | None:
        """Greedy: every node row's argmax (read with the verdict); sampling draws on the host instead."""
        return None if self.sampling else logits[: 1 + num_draft].argmax(-1)

    def observe(self, verification: Verification) -> None:
        # node row i predicts draft position i; after n accepted and one emitted, rows n+1..k are the positions that
        # follow, conditioned on the old drafts: their new distributions are the Jacobi update
        n = verification.accepted
        if verification.num_draft <= n:
            self.guess, self.guess_q = [], None
            return
        if not self.sampling:
            self.guess, self.guess_q = self.asked(verification).tolist()[n + 1 :], None
            return
        rows = verification.node_logits[n + 1 :]  # [k - n, V]
        cfg = self.cfg
        p = target_distribution(rows, cfg.temperature, cfg.top_k, cfg.top_p, cfg.min_p).cpu()  # [k - n, V]
        new = torch.multinomial(p, 1, generator=self.generator).squeeze(1) if not self.coupling else None
        if self.coupling:
            old_tokens = self.last.tokens[n + 1 :]  # drafts that stood at these positions (all but the last row)
            old_q = self.last.probs[n + 1 :].cpu() if self.last.probs is not None else None
            new = torch.tensor([self._couple(p[j], old_tokens, old_q, j) for j in range(p.shape[0])])
        assert new is not None
        self.guess, self.guess_q = new.tolist(), p

    def _couple(self, p: torch.Tensor, old_tokens: torch.Tensor, old_q: torch.Tensor | None, j: int) -> int:
        """A draw from p maximally coupled with the old draft at this position (a plain draw where there was none)."""
        gen = self.generator
        if old_q is None or j >= old_tokens.numel():
            return int(torch.multinomial(p, 1, generator=gen))
        x, q = int(old_tokens[j]), old_q[j]
        u = float(torch.rand((), generator=gen))
        if u * float(q[x]) < float(p[x]):  # keep w.p. min(1, p(x) / q(x))
            return x
        residual = (p - q).clamp(min=0.0)
        return int(torch.multinomial(residual if float(residual.sum()) > 0 else p, 1, generator=gen))



def image_of(model: CausalLM) -> Any:
    """The model's ImageSpec (`models/image.py`), or None for a text model."""
    return getattr(model, "image", None)


def window_for(model: CausalLM, cfg: SpecConfig, window: int, init: str, coupling: bool,
               generator: torch.Generator | None) -> JacobiWindow:
    """One row's window on `model`: on an image model only the codebook ids are drafted at random and `vertical`
    copies the token one grid row above; on a text model every id may be drafted."""
    image = image_of(model)
    return JacobiWindow(cfg, window, init, coupling, vocab=model.vocab_size,
                        allowed=image.K if image is not None else None,
                        grid_width=image.w if image is not None else None,
                        generator=generator, device=model.device)
