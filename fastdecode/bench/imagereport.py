"""The image benchmark's pictures and tables: sample grids as PNG files (written here, no imaging library needed)
and report.md, one table per model with every run's metrics rows beside their grids."""

from __future__ import annotations

import struct
import zlib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

CELL = 28  # a grid cell is at least this many pixels a side: small images are enlarged by a whole factor
PAD = 2


def png_bytes(pixels: np.ndarray) -> bytes:
    """A grey 8-bit PNG of uint8 pixels [H, W]."""
    h, w = pixels.shape

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + pixels[y].astype(np.uint8).tobytes() for y in range(h))  # filter 0 per scan line
    header = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)  # 8-bit greyscale
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def grid(images: Sequence[np.ndarray], labels: Sequence[int], classes: int, per_class: int) -> np.ndarray:
    """One column per class (0 on the left), its first `per_class` images top to bottom, on a mid-grey background
    [H', W']: wide and short, so that it sits in a table row."""
    h, w = np.asarray(images[0]).shape
    scale = max(1, -(-CELL // max(h, w)))  # ceil
    ch, cw = h * scale + PAD, w * scale + PAD
    canvas = np.full((per_class * ch + PAD, classes * cw + PAD), 128, dtype=np.uint8)
    filled = [0] * classes
    for image, c in zip(images, labels, strict=True):
        if filled[c] >= per_class:
            continue
        big = np.kron(np.asarray(image, dtype=np.uint8), np.ones((scale, scale), dtype=np.uint8))
        y, x = PAD + filled[c] * ch, PAD + c * cw
        canvas[y:y + h * scale, x:x + w * scale] = big
        filled[c] += 1
    return canvas


def write_grid(path: Path, images: Sequence[np.ndarray], labels: Sequence[int], classes: int,
               per_class: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png_bytes(grid(images, labels, classes, per_class)))
    return path


def _f(x: Any, digits: int = 2, scale: float = 1.0, suffix: str = "") -> str:
    return "—" if x is None else f"{x * scale:.{digits}f}{suffix}"


def _g(x: Any) -> str:
    """Three significant digits (KID's scale follows the features' and the cubic kernel's)."""
    return "—" if x is None else f"{x:.3g}"


def metrics_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per metrics row of a run: the method rows, then the floors (reference, independent)."""
    lines = ["| method | forwards/image | FD ↓ | gap g ↓ | KID ↓ | class acc. | precision | recall "
             "| NLL/token | ms/image b1 | speed-up b1 | ms/image b64 | speed-up b64 | N | samples |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    base = next((r for r in rows if r.get("is_baseline")), None)
    indep = next((r for r in rows if r.get("method") == "independent"), None)
    for r in rows:
        if r.get("method") == "reference":
            continue
        name = f"**{r['entry']}** (baseline)" if r.get("is_baseline") else r["entry"]
        gap = None
        if base and indep and indep["fd"] > base["fd"]:
            gap = (r["fd"] - base["fd"]) / (indep["fd"] - base["fd"])
        lines.append(
            f"| {name} | {r['forwards_per_image']:.1f} | {r['fd']:.2f} | {_f(gap)} "
            f"| {_g(r['kid'])} ± {_g(r.get('kid_std'))} | {_f(r['class_accuracy'], 1, 100, '%')} "
            f"| {r['precision']:.2f} | {r['recall']:.2f} | {r['nll_per_token']:.3f} "
            f"| {_f(r.get('wall_s_b1'), 1, 1e3)} | {_f(r.get('speedup_b1'), 2, 1, '×')} "
            f"| {_f(r.get('wall_s_batch'), 2, 1e3)} | {_f(r.get('speedup_batch'), 2, 1, '×')} | {r['n']} "
            f"| ![{r['entry']}]({r['grid']}) |")
    ref = next((r for r in rows if r.get("method") == "reference"), None)
    if ref:
        lines += ["", f"Floors: the tokenizer's (real test images against the reference set): FD {ref['fd']:.2f}, "
                  f"KID {_g(ref['kid'])}, precision {ref['precision']:.2f}, recall {ref['recall']:.2f}; "
                  f"evaluator accuracy {100 * ref['class_accuracy']:.1f}% on the real test images and "
                  f"{100 * ref['reference_class_accuracy']:.1f}% on the reference set. Sampling noise (two halves "
                  f"of the reference set, {ref['n'] // 2} images each): FD {ref['halves_fd']:.2f}, KID "
                  f"{_g(ref['halves_kid'])}."]
    return lines


def pooled_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Mean ± standard deviation over the runs (seeds) of each entry at one N, where an entry has several runs."""
    groups: dict[tuple[str, int], list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        if r.get("method") != "reference":
            groups[(r["entry"], r["n"])].append(r)
    if not any(len(g) > 1 for g in groups.values()):
        return []

    def ms(group: Sequence[Mapping[str, Any]], key: str, digits: int, scale: float = 1.0) -> str:
        values = [g[key] * scale for g in group if g.get(key) is not None]
        if not values:
            return "—"
        return f"{np.mean(values):.{digits}f} ± {np.std(values):.{digits}f}"

    lines = ["| method | N | runs | forwards/image | FD | KID | class acc. % | precision | recall | NLL/token "
             "| speed-up b1 | speed-up b64 |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (entry, n), group in groups.items():
        lines.append(f"| {entry} | {n} | {len(group)} | {ms(group, 'forwards_per_image', 1)} | {ms(group, 'fd', 2)} "
                     f"| {ms(group, 'kid', 1)} | {ms(group, 'class_accuracy', 1, 100)} "
                     f"| {ms(group, 'precision', 2)} | {ms(group, 'recall', 2)} | {ms(group, 'nll_per_token', 3)} "
                     f"| {ms(group, 'speedup_b1', 2)} | {ms(group, 'speedup_batch', 2)} |")
    return lines


def write_report(folder: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """report.md from every metrics row of the folder: per model, per run (newest last)."""
    by_model: dict[str, dict[str, list[Mapping[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by_model[r["model"]][r["run"]].append(r)
    lines = ["# Image benchmark: class-conditional generation", "",
             "Made by `fastdecode bench-image` (docs/image.md, \"Measuring\"). Per method: forwards per image; the "
             "Fréchet distance (FD) and KID (unbiased MMD², cubic kernel, mean ± spread over subsets) of the "
             "evaluator's 64-d features against the reference set (the test images through the model's "
             "tokenizer); gap g = (FD − FD of ar.sample) / (FD of independent − FD of ar.sample); the share of "
             "samples the evaluator reads as the asked class; k-NN precision and recall (k = 3); the guided "
             "teacher's NLL per token of the samples (nats; lower than ar.sample's = mode collapse); wall time per "
             "image at batch 1 and batch 64 and the speed-up over ar.sample of the same run. `independent` draws "
             "every token from its class-conditional per-position marginal of the train codes.", ""]
    for model, runs in by_model.items():
        lines += [f"## {model}", ""]
        pooled = pooled_table([r for run in runs.values() for r in run])
        if pooled:
            lines += ["Over the runs (mean ± standard deviation across seeds; each run's own table follows):", "",
                      *pooled, ""]
        for run, mine in runs.items():
            head = mine[0]
            m = head.get("machine") or {}
            cfg = head.get("config") or {}
            lines += [f"Run `{run}` ({head.get('time', mine[-1].get('time', ''))}): {cfg.get('per_class')} images "
                      f"per class, seed {cfg.get('seed')}, {m.get('device_name')} ({m.get('torch_threads')} torch "
                      f"thread(s)); made by `{head.get('command') or '—'}`", ""]
            lines += metrics_table(mine) + [""]
    path = folder / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
