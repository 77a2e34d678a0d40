"""spec.sjd is lossless in distribution on an image model: the joint law of the first three codes it writes equals
the tiny 4-level teacher's, enumerated exactly (4^3 = 64 cells), for windows 2 and 4, random and vertical
initialisation, with and without MC-SJD's coupling and under classifier-free guidance (Pearson chi-square)."""

from __future__ import annotations

import itertools

import pytest
import torch
from statistical.sampling_stats import chi_square_p_value  # tests/ is on the path (rootdir conftest)

from fastdecode.engine import encode_batch
from fastdecode.registry import RunContext
from fastdecode.speculative.drafters.sjd import SJDConfig
from fastdecode.speculative.driver import speculative
from fastdecode.speculative.jacobi_window import JacobiWindow
from fastdecode.speculative.verify import target_distribution

N = 2000  # images per case, one batch
CELLS = list(itertools.product(range(4), repeat=3))


def joint_of_first_three(model, prompt: int) -> torch.Tensor:
    """`[64]` p(a) p(b | a) p(c | a, b) over the 4 codes, from full forwards without a cache."""
    ids = torch.tensor([[prompt, a, b] for a, b in itertools.product(range(4), repeat=2)], device=model.device)
    logits = model.forward(ids, torch.arange(3, device=model.device)[None].expand(16, 3))  # [16, 3, V]
    p = target_distribution(logits.reshape(48, -1), 1.0).reshape(16, 3, -1)[..., :4]  # [16, 3, 4]
    return torch.tensor([float(p[4 * a + b, 0, a] * p[4 * a + b, 1, b] * p[4 * a + b, 2, c]) for a, b, c in CELLS])

CASES = [  # window, init, grid width for "vertical" (2: the copy happens within the first three codes), coupling, cfg
    (2, "random", None, False, False),
    (4, "vertical", 2, False, False),
    (2, "random", None, True, False),
    (4, "vertical", 2, True, False),
    (4, "vertical", 2, True, True),
]


@pytest.mark.parametrize(("window", "init", "width", "coupling", "guided"), CASES)
def test_sjd_first_three_codes_follow_the_teacher(tiny_image_model, window, init, width, coupling, guided):
    model = tiny_image_model.with_scale(3.0) if guided else tiny_image_model
    prompt = model.image.label_token("7")
    cfg = SJDConfig(max_new_tokens=window + 1, temperature=1.0, seed=100 * window + coupling + 7 * guided,
                    window=window, init=init, coupling=coupling)
    batch = encode_batch(model, [[prompt]] * N, cfg.max_new_tokens)

    def drafter(generator):
        return JacobiWindow(cfg, window, init, coupling, vocab=model.vocab_size, allowed=model.image.K,
                            grid_width=width, generator=generator, device=model.device)

    rows: list[dict[int, int]] = [{} for _ in range(N)]
    accepted = 0
    for event in speculative(model, batch, cfg, RunContext(), drafter):
        accepted += sum(event.accepted)
        for b, pairs in enumerate(event.tokens):
            rows[b].update(pairs)
    assert accepted > 0.05 * N  # drafts are accepted, and the residual path is common (the test sees both)
    samples = [CELLS.index((r[0], r[1], r[2])) for r in rows]  # each draw as its cell of the joint
    assert chi_square_p_value(samples, joint_of_first_three(model, prompt)) > 1e-3
