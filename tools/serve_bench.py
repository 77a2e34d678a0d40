"""Throughput and latency of `fastdecode serve` against the number of concurrent clients (JSONL + table + plot).

For each method, a fresh server (`fastdecode serve`, its own process, so that drafters that learn across requests,
spec.suffix, start empty); for each concurrency C, C clients each send streaming completions one after the other
until the level's prompts are used up (a closed loop). Each concurrency level uses prompts of its own (no prompt is
seen twice by one server); every method sees the same prompts at the same level. Per request: time to first token
(TTFT), the gaps between streamed chunks (inter-token latency; a speculative step delivers several tokens in one
chunk), end-to-end latency and tokens (from the stream's usage). Per level: tokens/s over the level's wall time.

    python tools/serve_bench.py --model zoo:ar-small --methods ar.greedy spec.pld spec.suffix \\
        --concurrency 1 4 16 --requests 32 --out docs/results/serve/serve.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from fastdecode.bench.jobs import cpu_name, versions  # noqa: E402
from fastdecode.bench.suites import get_suite  # noqa: E402
from fastdecode.bench.tasks import format_prompt  # noqa: E402


def prompts_of(suites: list[str], n: int) -> list[str]:
    """n prompts, alternating between the suites' test items."""
    per = {s: [format_prompt(item.prompt) for task, seed, k in get_suite(s).plan(limit=n)
               for item in task.items(seed, k)] for s in suites}
    out: list[str] = []
    i = 0
    while len(out) < n:
        for s in suites:
            if i < len(per[s]) and len(out) < n:
                out.append(per[s][i])
        i += 1
        if all(i >= len(v) for v in per.values()):
            break
    if len(out) < n:
        raise SystemExit(f"only {len(out)} prompts in {suites}; ask for fewer requests")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(model: str, method: str, threads: int, max_batch: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "fastdecode", "serve", "--model", model, "--method", method,
                             "--port", str(port), "--threads", str(threads), "--max-batch", str(max_batch)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server for {method} exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("the server did not start")


async def one(client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    stamps: list[float] = []
    usage: dict = {}
    text = []
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if data.get("usage"):
                usage = data["usage"]
            for c in data.get("choices", []):
                if c.get("text"):
                    stamps.append(time.perf_counter())
                    text.append(c["text"])
    end = time.perf_counter()
    return {"ttft_s": stamps[0] - start if stamps else end - start, "e2e_s": end - start,
            "itl_s": [b - a for a, b in zip(stamps, stamps[1:], strict=False)], "chunks": len(stamps),
            "completion_tokens": usage.get("completion_tokens", 0), "prompt_tokens": usage.get("prompt_tokens", 0),
            "accepted": usage.get("completion_tokens_details", {}).get("accepted_prediction_tokens", 0),
            "output": "".join(text)}


async def level(url: str, model: str, prompts: list[str], concurrency: int, max_tokens: int) -> tuple[list, float]:
    todo = list(enumerate(prompts))
    results: list[dict] = []

    async def client_loop(client: httpx.AsyncClient) -> None:
        while todo:
            i, prompt = todo.pop(0)
            results.append({"request": i, **await one(client, url, model, prompt, max_tokens)})

    async with httpx.AsyncClient(timeout=600) as client:
        start = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return results, wall


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q / 100 * (len(v) - 1))))]


def summarize(rows: list[dict]) -> list[dict]:
    greedy = {(r["concurrency"], r["request"]): r["output"] for r in rows if r["method"] == "ar.greedy"}
    out = []
    for key in dict.fromkeys((r["method"], r["concurrency"]) for r in rows):
        mine = [r for r in rows if (r["method"], r["concurrency"]) == key]
        tokens = sum(r["completion_tokens"] for r in mine)
        wall = mine[0]["level_wall_s"]
        itl = [x for r in mine for x in r["itl_s"]]
        same = [r["output"] == greedy[(r["concurrency"], r["request"])] for r in mine
                if (r["concurrency"], r["request"]) in greedy]
        out.append({"method": key[0], "concurrency": key[1], "requests": len(mine), "tokens": tokens,
                    "load_avg_1m": mine[0].get("load_avg_1m"),
                    "same_as_greedy": sum(same) / len(same) if same else None,
                    "tokens_per_s": tokens / wall, "requests_per_s": len(mine) / wall,
                    **{f"ttft_p{q}_ms": 1000 * pct([r["ttft_s"] for r in mine], q) for q in (50, 90, 99)},
                    **{f"itl_p{q}_ms": 1000 * pct(itl, q) for q in (50, 90, 99)},
                    **{f"e2e_p{q}_s": pct([r["e2e_s"] for r in mine], q) for q in (50, 90, 99)}})
    return out


def markdown(summary: list[dict], command: str, machine: str) -> str:
    lines = ["# fastdecode serve: throughput and latency vs concurrency", "",
             f"Made by `{command}` on {machine}. Streaming completions, closed loop: C clients each send the next "
             "request when their last one has finished. TTFT: time to the first streamed text; ITL: gaps between "
             "streamed chunks (a speculative step sends several tokens in one chunk); E2E: request latency.", "",
             "The load average (1 min) before each level shows what else the machine was doing.", "",
             "| method | C | tok/s | req/s | TTFT p50 / p90 / p99 (ms) | ITL p50 / p90 / p99 (ms) "
             "| E2E p50 / p90 / p99 (s) | = ar.greedy | load |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in summary:
        lines.append(f"| {s['method']} | {s['concurrency']} | {s['tokens_per_s']:.0f} | {s['requests_per_s']:.2f} "
                     f"| {s['ttft_p50_ms']:.0f} / {s['ttft_p90_ms']:.0f} / {s['ttft_p99_ms']:.0f} "
                     f"| {s['itl_p50_ms']:.1f} / {s['itl_p90_ms']:.1f} / {s['itl_p99_ms']:.1f} "
                     f"| {s['e2e_p50_s']:.2f} / {s['e2e_p90_s']:.2f} / {s['e2e_p99_s']:.2f} "
                     f"| {'—' if s['same_as_greedy'] is None else format(s['same_as_greedy'], '.0%')} "
                     f"| {'—' if s['load_avg_1m'] is None else format(s['load_avg_1m'], '.1f')} |")
    return "\n".join(lines) + "\n"


def plot(summary: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for method in dict.fromkeys(s["method"] for s in summary):
        mine = [s for s in summary if s["method"] == method]
        cs = [s["concurrency"] for s in mine]
        a.plot(cs, [s["tokens_per_s"] for s in mine], marker="o", label=method)
        b.plot(cs, [s["e2e_p50_s"] for s in mine], marker="o", label=method)
    levels = sorted({s["concurrency"] for s in summary})
    for ax, title in ((a, "throughput (generated tokens/s)"), (b, "end-to-end latency p50 (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("concurrent clients")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    a.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="zoo:ar-small")
    p.add_argument("--methods", nargs="+", default=["ar.greedy", "spec.pld", "spec.suffix"])
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16])
    p.add_argument("--requests", type=int, default=32, help="requests per concurrency level")
    p.add_argument("--suites", nargs="+", default=["code", "parallel-lists"])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--out", default="docs/results/serve/serve.jsonl")
    p.add_argument("--report-only", action="store_true", help="rebuild report.md and the plot from --out")
    args = p.parse_args()
    if args.report_only:
        rows = [json.loads(line) for line in Path(args.out).read_text().splitlines() if line.strip()]
        write_report(rows, Path(args.out), rows[0]["command"], rows[0]["machine"])
        return
    command = "python tools/serve_bench.py " + shlex.join(sys.argv[1:])
    prompts = prompts_of(args.suites, args.requests * len(args.concurrency))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = {"cores": os.cpu_count(), "cpu": cpu_name() or platform.machine(), "torch_threads": args.threads,
               "platform": platform.platform(), "python": platform.python_version()}
    rows: list[dict] = []
    for method in args.methods:
        proc, url = start_server(args.model, method, args.threads, args.max_batch)
        try:
            asyncio.run(level(url, args.model, prompts[:2], 2, 8))  # warm-up (not recorded)
            for k, c in enumerate(args.concurrency):
                mine = prompts[k * args.requests : (k + 1) * args.requests]
                load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None  # a shared machine's other work
                results, wall = asyncio.run(level(url, args.model, mine, c, args.max_tokens))
                for r in sorted(results, key=lambda r: r["request"]):
                    rows.append({"method": method, "concurrency": c, "model": args.model,
                                 "max_tokens": args.max_tokens, "level_wall_s": wall, "load_avg_1m": load, **r,
                                 "machine": machine, **versions(), "command": command,
                                 "time": datetime.now(timezone.utc).isoformat(timespec="seconds")})
                print(f"{method} C={c}: {sum(r['completion_tokens'] for r in results) / wall:.0f} tok/s", flush=True)
        finally:
            proc.terminate()
            proc.wait(60)
    with out.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(write_report(rows, out, command, machine))


def write_report(rows: list[dict], out: Path, command: str, machine: dict) -> str:
    summary = summarize(rows)
    where = f"{machine['cpu']} ({machine['cores']} cores, {machine['torch_threads']} torch thread(s))"
    text = markdown(summary, command, where)
    out.with_name("report.md").write_text(text)
    plot(summary, out.with_name("serve.png"))
    return text


if __name__ == "__main__":
    main()
