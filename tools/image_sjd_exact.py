"""spec.sjd against ar.sample on the trained teacher: a two-sample chi-square test of the code drawn at a few raster
positions (issue #33's bar (b): positions 10, 25 and 48, N images per method, Bonferroni over the positions).

The exact test against an enumerated distribution runs on the tiny 4-level model in the suite
(tests/image/test_sjd_exact.py); a 49-token image of 64 codes cannot be enumerated, so here the two samplers are
compared with each other. Both generate the same labels (N / 10 per class) in one batch each, with different seeds.
One JSONL row per configuration.

    python tools/image_sjd_exact.py --model zoo:img-ar --n 2000 --threads 1 --out docs/results/image/sjd_exact.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import fastdecode  # noqa: E402

POSITIONS = (10, 25, 48)
CONFIGS = [("spec.sjd (window=16)", {"window": 16}), ("spec.sjd (window=16, coupling)", {"window": 16,
                                                                                        "coupling": True})]


def two_sample_p(a: torch.Tensor, b: torch.Tensor, K: int) -> float:
    """Pearson's chi-square test of homogeneity of two samples of codes (cells with < 5 expected pooled)."""
    ca = torch.bincount(a, minlength=K).double()
    cb = torch.bincount(b, minlength=K).double()
    total = ca + cb
    big = total >= 10
    ca = torch.cat([ca[big], ca[~big].sum()[None]])
    cb = torch.cat([cb[big], cb[~big].sum()[None]])
    keep = (ca + cb) > 0
    ca, cb = ca[keep], cb[keep]
    na, nb = ca.sum(), cb.sum()
    ea, eb = (ca + cb) * na / (na + nb), (ca + cb) * nb / (na + nb)
    stat = ((ca - ea) ** 2 / ea + (cb - eb) ** 2 / eb).sum()
    df = int(keep.sum()) - 1
    if df < 1:  # one cell: both samples drew the same code everywhere
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2))


def codes(model, method: str, labels: list[str], seed: int, **params) -> torch.Tensor:
    results = fastdecode.generate(model, labels, method, temperature=1.0, seed=seed, **params)
    return torch.tensor([r.token_ids for r in results])  # [N, h*w]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="zoo:img-ar")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "image" / "sjd_exact.jsonl")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = fastdecode.load(args.model)
    K = model.image.K
    labels = [str(i % 10) for i in range(args.n)]
    base = codes(model, "ar.sample", labels, seed=1)
    command = "python tools/image_sjd_exact.py " + " ".join(sys.argv[1:])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        for i, (label, params) in enumerate(CONFIGS):
            got = codes(model, "spec.sjd", labels, seed=2 + i, **params)
            p = {str(pos): two_sample_p(base[:, pos], got[:, pos], K) for pos in POSITIONS}
            row = {"suite": "image-sjd-exact", "model": args.model, "label": label, "baseline": "ar.sample",
                   "images": args.n, "positions": list(POSITIONS), "p_values": p,
                   "min_p_bonferroni": min(1.0, min(p.values()) * len(POSITIONS)), "command": command}
            f.write(json.dumps(row) + "\n")
            print(json.dumps(row))


if __name__ == "__main__":
    main()
