"""What one verification step tells a drafter: `Drafter.observe(Verification)`.

The target's verification forward scores the root (the last context token), the k draft nodes (a chain or a
tree, in draft order) and the S side tokens a drafter rode on the forward (Lookahead's Jacobi window). Drafters
read those parts by name instead of slicing the forward's rows themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Verification:
    """One step's outcome for one row: what was accepted and emitted, and what the target computed.

    `hidden` is there only for a drafter whose class sets `needs_hidden = True` (drafters that read the target's
    features: EAGLE, Medusa, Hydra heads). It covers every token the forward fed: the P context tokens the target
    had not seen yet (the whole prompt at the first step; the root is the last of them), then the k draft nodes,
    then the S side tokens; transformers' `hidden_states[-1]`, after the final norm (see `CausalOutput`).
    """

    accepted: int  # draft tokens accepted: a chain's prefix, or the accepted root path of a tree
    tokens: tuple[int, ...]  # tokens emitted this step: the accepted draft tokens, then the target's own one
    logits: torch.Tensor  # [1 + k + S, V] float32: the root's, the k draft nodes', the S side tokens'
    num_draft: int  # k, the draft nodes verified (0 for an empty draft)
    hidden: torch.Tensor | None = None  # [P + k + S, H] in the target's dtype; None unless the drafter needs it

    @property
    def root_logits(self) -> torch.Tensor:
        """`[V]`: the target's logits at the last context token (they gave the first emitted token)."""
        return self.logits[0]

    @property
    def draft_logits(self) -> torch.Tensor:
        """`[k, V]`: row i is the target's logits after draft node i (at node i's position on its tree path)."""
        return self.logits[1 : 1 + self.num_draft]

    @property
    def node_logits(self) -> torch.Tensor:
        """`[1 + k, V]`: the root's row, then the draft nodes' (one row per input token of the draft)."""
        return self.logits[: 1 + self.num_draft]

    @property
    def side_logits(self) -> torch.Tensor | None:
        """`[S, V]` the side tokens' logits, in the order the drafter listed them; None without side tokens."""
        return self.logits[1 + self.num_draft :] if self.logits.shape[0] > 1 + self.num_draft else None

    @property
    def context_hidden(self) -> torch.Tensor | None:
        """`[P, H]`: hidden states of the context tokens this forward fed (the root last)."""
        if self.hidden is None:
            return None
        return self.hidden[: self.hidden.shape[0] - (self.logits.shape[0] - 1)]

    @property
    def node_hidden(self) -> torch.Tensor | None:
        """`[1 + k, H]`: hidden states of the root and the draft nodes, row for row with `node_logits`."""
        if self.hidden is None:
            return None
        start = self.hidden.shape[0] - self.logits.shape[0]
        return self.hidden[start : start + 1 + self.num_draft]
