"""The autoregressive drafting loop shared by the chain drafters that run a causal model token by token with
their own KV cache (spec.draft_model with a separate draft model, spec.layerskip with the target minus some
layers), and their token pick (spec.sparse_self too). The tree drafters that run a draft model share
`model_tree.py` instead."""

from __future__ import annotations

from typing import cast

import torch

from ..models.base import on_host
from ..models.causal import CausalLM
from .drafter import BaseDrafter, Draft, SpecConfig, Verification
from .verify import float_bits, from_bits, target_distribution


def pick_token(
    logits: torch.Tensor, cfg: SpecConfig, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A chain drafter's next token from its `[V]` logits: the argmax when greedy; when sampling, x ~ q with the
    target's processors applied, and q itself (verification needs it)."""
    if cfg.greedy:
        return logits.argmax(), None
    q = target_distribution(logits[None], cfg.temperature, cfg.top_k, cfg.top_p)[0]  # [V]
    return torch.multinomial(q, 1, generator=generator)[0], q


def reads_each_token(read_each_token: bool | None, device: torch.device, stops: bool = False) -> bool:
    """Whether a drafting loop reads each token as it comes (and stops at an end of text) rather than leaving its
    drafts unread on the device for the verification to read with its verdict: where a stop decides the next forward
    (`stops`: an unsure token's), and on the CPU, where a read costs nothing and a forward past an end of text does.
    A sampled chain left unread draws past an end of text (its draws then differ from the CPU's path, which stops
    there; each path repeats with its seed, and the output keeps the target's law: settling the step ends it at the
    end of text). `read_each_token` (a drafter class's attribute; None: by the device) lets tests run the GPU's path
    on the CPU."""
    on_cpu = on_host(device) if read_each_token is None else read_each_token
    return stops or on_cpu


class ModelChainDrafter(BaseDrafter):
    """Drafts a chain with `model`, one forward per token, keeping the model's KV cache in step with the accepted
    context: `propose` feeds the context the cache has not seen, then each drafted token; `observe` drops the
    rejected drafts from the cache. Subclasses choose the draft length and wrap the loop (`draft_chain`)."""

    # whether the chain reads each token as it comes (`reads_each_token`): None = on the CPU only; tests set
    # False to run the GPU's path on the CPU
    read_each_token: bool | None = None

    def __init__(
        self, model: CausalLM, cfg: SpecConfig, generator: torch.Generator | None, confidence_stop: float = 0.0
    ) -> None:
        self.model, self.cfg, self.generator = model, cfg, generator
        self.confidence_stop = confidence_stop  # end the draft after a token whose max-probability is below this
        self.eos = model.eos_token_ids
        self.cache = model.new_cache()
        self.forwards = 0
        self._base = 0  # context length at the last proposal
        self._drafted = 0
        self.confidences: list[float] = []  # with a confidence stop: the last draft's, token by token

    def propose(self, context: torch.Tensor, k: int) -> Draft:
        return self.draft_chain(context, k)

    def draft_chain(self, context: torch.Tensor, k: int) -> Draft:
        """At most k tokens after `context`; ends at an end of text, or early at an unsure token.

        Greedy on a GPU without `confidence_stop`, the loop reads nothing from the device: it drafts k tokens and
        returns them unread on the device, where the target's verification reads them with its own verdict, the
        step's one read (on a GPU each read is a synchronisation, issue #30); an end of text among them ends the
        output where the driver settles the step (the forwards past it are the price, paid only in that step). An
        unsure token's stop decides the next forward, so with `confidence_stop` every token is read as it comes
        (`reads_each_token`). Sampling, the same holds: the draws and their q stay on the device."""
        n = context.numel()
        device = self.model.device
        feed = context[self.cache.length :].to(device)  # context the cache has not seen (>= 1 token)
        pos = torch.arange(self.cache.length, n, device=device)
        each = reads_each_token(self.read_each_token, device, stops=bool(self.confidence_stop))
        tokens, probs = [], []
        read: list[int] = []  # the tokens read as they came (`each`)
        self.confidences = []
        for _ in range(k):
            logits = self.model.forward(feed[None], pos[None], self.cache, num_logits=1)[0, -1]  # [V]
            self.forwards += 1
            x, q = pick_token(logits, self.cfg, self.generator)
            tokens.append(x)
            probs.append(q)
            if each:  # a read per token: the token, with its confidence where a stop asks for it (one copy)
                if self.confidence_stop:
                    token, bits = torch.stack([x.long(), float_bits(logits.softmax(-1).max())]).tolist()
                    read.append(token)
                    self.confidences.append(float(from_bits([bits])[0]))
                else:
                    read.append(int(x))
                if read[-1] in self.eos or (self.confidence_stop and self.confidences[-1] < self.confidence_stop):
                    break
            feed, pos = x.view(1), pos[-1:] + 1
        if not tokens:
            self._base, self._drafted = n, 0
            return Draft.empty()
        # nothing after an end of text can be emitted: a chain read as it came ends with it; one left unread on the
        # device goes to the verification whole, which reads it with its verdict, and settling the step ends the
        # output at the first end of text among the accepted tokens
        m = next((i + 1 for i, t in enumerate(read) if t in self.eos), len(tokens)) if each else len(tokens)
        self._base, self._drafted = n, m
        # [m, V]; pick_token gives q for every token (sampling) or for none (greedy)
        q = torch.stack(cast(list[torch.Tensor], probs[:m])) if probs[0] is not None else None
        drafted = torch.tensor(read, dtype=torch.long) if each else torch.stack(tokens)  # (each read: on the host)
        return Draft(drafted[:m], q)

    def observe(self, verification: Verification) -> None:
        if self._drafted == 0:
            return
        # the cache holds context + x_1..x_{m-1}; keep the context and the accepted drafts among them
        self.cache.crop(self._base + min(verification.accepted, self._drafted - 1))
