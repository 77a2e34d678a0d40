"""Stats: the one measurement vocabulary shared by every method family.

Drivers yield `types.StepEvent`s; `engine.py` adds them up into one `Stats` per row. The fields are
explained in docs/architecture.md ("Stats").
"""

from __future__ import annotations

import resource
import sys
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Stats:
    """Counts and timings of one generation.

    For `spec.*`, `proposed`/`accepted` count drafted/accepted tokens and `tokens_per_forward` is the
    mean acceptance length τ including the bonus token. For `dlm.*`, steps map to drafts and committed
    positions to accepted tokens.
    """

    prompt_tokens: int = 0
    new_tokens: int = 0  # generated tokens up to and including the first EOS
    forwards: int = 0  # target-model forward passes (NFE)
    draft_forwards: int = 0
    proposed: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # [k]: steps whose draft position k was accepted
    wall_s: float = 0.0
    # where the time goes (speculative methods): drafting, and the target's verification forward + accept rule;
    # the rest of wall_s is overhead (cache roll-back, bookkeeping, the Python loop)
    draft_s: float = 0.0
    verify_s: float = 0.0
    peak_rss_mb: float = 0.0
    peak_device_mb: float = 0.0  # CUDA peak allocated memory; 0 on CPU
    finish_reason: str = ""  # "eos" or "length"

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / self.forwards if self.forwards else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of wall time; the prompt is never counted."""
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            tokens_per_forward=self.tokens_per_forward,
            tokens_per_s=self.tokens_per_s,
            acceptance_rate=self.acceptance_rate,
        )
        return d

    def summary(self) -> str:
        """A one-line human summary (used by the CLI)."""
        parts = [
            f"{self.new_tokens} tokens",
            f"{self.forwards} forwards",
            f"{self.tokens_per_forward:.2f} tok/forward",
            f"{self.wall_s:.2f} s",
            f"{self.tokens_per_s:.1f} tok/s",
        ]
        if self.proposed:
            parts.append(f"accepted {self.accepted}/{self.proposed}")
        if self.draft_forwards:
            parts.append(f"{self.draft_forwards} draft forwards")
        return " · ".join(parts)


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux
