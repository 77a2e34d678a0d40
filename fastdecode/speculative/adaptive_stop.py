"""An adaptive confidence stop for draft models: transformers' assisted generation re-chooses its
`assistant_confidence_threshold` during a generation where scikit-learn is installed
(`AssistedCandidateGenerator.update_candidate_strategy`, read in transformers 5.24), and
`spec.draft_model:adaptive_stop=true` does the same, so that it drafts as `hf.assisted` does there.

The rule, as transformers runs it: each drafted token's confidence (the draft's probability of it) is kept with
whether the target accepted it; a draft's tokens after its first rejected one are dropped (their fate is unknown).
Once more than five are kept, both accepted and rejected among them, the threshold becomes the one on their ROC
curve (scikit-learn's `roc_curve`, its collinear points dropped) that minimises the false positive rate plus three
times the false negative rate, the first such in descending order (+inf, a stop after every token, is a candidate
but costs 3, more than the lowest score's at most 1). Computed here without scikit-learn, in float64 as it does, so
that ties break the same way (tested against it where installed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


class AdaptiveStop:
    """The threshold of a confidence stop, updated after each verification from one generation's drafts."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.scores: list[float] = []  # confidences of the drafted tokens with a known fate, in drafting order
        self.hits: list[int] = []  # 1 accepted, 0 rejected

    def update(self, confidences: Sequence[float], accepted: int) -> float:
        """Record a draft (its tokens' confidences, the number accepted) and return the threshold for the next."""
        if confidences:
            kept = min(accepted, len(confidences))
            known = [1] * kept + ([0] if kept < len(confidences) else [])  # the first rejected one too
            self.hits.extend(known)
            self.scores.extend(confidences[: len(known)])
            if len(self.scores) > 5 and 0 in self.hits and 1 in self.hits:
                self.threshold = best_threshold(self.scores, self.hits)
        return self.threshold


def best_threshold(scores: Sequence[float], hits: Sequence[int]) -> float:
    """The threshold minimising fpr + 3 fnr over the ROC curve of `scores` against `hits` (both classes present)."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    values: list[float] = []  # distinct scores, descending, each with the counts at or above it
    tps: list[float] = []
    fps: list[float] = []
    tp = 0
    for rank, i in enumerate(order):
        tp += hits[i]
        if rank + 1 < len(order) and scores[order[rank + 1]] == scores[i]:
            continue  # equal scores share one point
        values.append(scores[i])
        tps.append(float(tp))
        fps.append(float(rank + 1 - tp))
    if len(values) > 2:  # keep the corners: a point collinear with its neighbours cannot be the only minimum
        keep = [0] + [j for j in range(1, len(values) - 1)
                      if fps[j + 1] - 2 * fps[j] + fps[j - 1] or tps[j + 1] - 2 * tps[j] + tps[j - 1]]
        keep.append(len(values) - 1)
        values, tps, fps = [values[j] for j in keep], [tps[j] for j in keep], [fps[j] for j in keep]
    values, tps, fps = [math.inf, *values], [0.0, *tps], [0.0, *fps]
    positives, negatives = tps[-1], fps[-1]
    costs = [f / negatives + 3 * (1 - t / positives) for t, f in zip(tps, fps, strict=True)]
    return values[costs.index(min(costs))]
