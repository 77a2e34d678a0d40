"""The guided teacher's NLL per code of one-step DD samples and of ar.sample's, for docs/image-dd.md.

Usage: PYTHONPATH=. python tools/dd_nll.py [DD network folders ...] (default: the shipped dd1 and dd2).
Each network draws 128 rows from the cards' seed (`train/dd2.py: sample_nll`); ar.sample draws 64 images.
"""

from __future__ import annotations

import sys

import torch

import fastdecode
from fastdecode.heads import load_head
from fastdecode.train.dd2 import nll_per_token, sample_nll


def main(folders: list[str]) -> None:
    torch.set_num_threads(1)
    model = fastdecode.load("zoo:img-ar")
    guided = model.with_scale(model.image.cfg_scale)
    for folder in folders:
        net = load_head(folder, device="cpu", dtype=torch.float32)
        print(folder, round(sample_nll(guided, net, 0, 128), 3))
    image = guided.image
    labels = image.K + torch.randint(image.C, (64,), generator=torch.Generator().manual_seed(5))
    results = fastdecode.generate(model, [image.label_of(int(t)) for t in labels], method="ar.sample", seed=1)
    codes = torch.tensor([r.token_ids for r in results])
    print("ar.sample", round(nll_per_token(guided, labels, codes), 3))


if __name__ == "__main__":
    main(sys.argv[1:] or ["fastdecode/zoo/img-ar/heads/dd1", "fastdecode/zoo/img-ar/heads/dd2"])
