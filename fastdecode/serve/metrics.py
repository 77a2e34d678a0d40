"""Prometheus text for `/metrics`: counters, gauges and histograms under vLLM's names with the `fastdecode:` prefix
(vLLM writes `vllm:`), so dashboards made for vLLM read them with the prefix changed."""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque

PREFIX = "fastdecode:"
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, total = [], 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            total += n
            out.append(f'{name}_bucket{{le="{bound}"}} {total}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out += [f"{name}_sum {self.sum}", f"{name}_count {self.count}"]
        return out


class Metrics:
    """Thread-safe: the engine thread records, the HTTP handlers read."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos: list[int] = []
        self.success: dict[str, int] = {}
        self.rejected: dict[str, int] = {}  # refused requests by reason (queue_full, shutting_down, invalid)
        self.running = 0
        self.waiting = 0
        self.ttft = Histogram()
        self.itl = Histogram()
        self.e2e = Histogram()
        self.recent: deque[tuple[float, int]] = deque()  # (time, tokens) of the last seconds, for tokens/s

    def tokens(self, n: int) -> None:
        with self.lock:
            self.generation_tokens += n
            now = time.monotonic()
            self.recent.append((now, n))
            self._trim(now)

    def _trim(self, now: float, window: float = 10.0) -> None:
        while self.recent and self.recent[0][0] < now - window:
            self.recent.popleft()

    def drafts(self, proposed: int, accepted: int) -> None:
        with self.lock:
            self.num_drafts += 1
            self.num_draft_tokens += proposed
            self.num_accepted_tokens += accepted
            self.accepted_per_pos.extend([0] * (accepted - len(self.accepted_per_pos)))
            for k in range(accepted):
                self.accepted_per_pos[k] += 1

    def finished(self, reason: str, e2e: float, prompt_tokens: int) -> None:
        with self.lock:
            self.success[reason] = self.success.get(reason, 0) + 1
            self.e2e.observe(e2e)
            self.prompt_tokens += prompt_tokens

    def refused(self, reason: str) -> None:
        with self.lock:
            self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def observe(self, ttft: float | None = None, itl: float | None = None) -> None:
        with self.lock:
            if ttft is not None:
                self.ttft.observe(ttft)
            if itl is not None:
                self.itl.observe(itl)

    def render(self) -> str:
        p = PREFIX
        with self.lock:
            now = time.monotonic()
            self._trim(now)
            span = now - self.recent[0][0] if len(self.recent) > 1 else 0.0
            rate = sum(n for _, n in self.recent) / span if span > 0 else 0.0
            lines = [
                f"# TYPE {p}num_requests_running gauge", f"{p}num_requests_running {self.running}",
                f"# TYPE {p}num_requests_waiting gauge", f"{p}num_requests_waiting {self.waiting}",
                f"# TYPE {p}prompt_tokens_total counter", f"{p}prompt_tokens_total {self.prompt_tokens}",
                f"# TYPE {p}generation_tokens_total counter", f"{p}generation_tokens_total {self.generation_tokens}",
                f"# TYPE {p}avg_generation_throughput_toks_per_s gauge",
                f"{p}avg_generation_throughput_toks_per_s {rate:.3f}",
                f"# TYPE {p}spec_decode_num_drafts_total counter", f"{p}spec_decode_num_drafts_total {self.num_drafts}",
                f"# TYPE {p}spec_decode_num_draft_tokens_total counter",
                f"{p}spec_decode_num_draft_tokens_total {self.num_draft_tokens}",
                f"# TYPE {p}spec_decode_num_accepted_tokens_total counter",
                f"{p}spec_decode_num_accepted_tokens_total {self.num_accepted_tokens}",
                f"# TYPE {p}spec_decode_num_accepted_tokens_per_pos counter",
            ]
            lines += [f'{p}spec_decode_num_accepted_tokens_per_pos{{position="{k}"}} {n}'
                      for k, n in enumerate(self.accepted_per_pos)]
            lines.append(f"# TYPE {p}request_success_total counter")
            lines += [f'{p}request_success_total{{finished_reason="{r}"}} {n}' for r, n in sorted(self.success.items())]
            lines.append(f"# TYPE {p}request_rejected_total counter")
            lines += [f'{p}request_rejected_total{{reason="{r}"}} {n}' for r, n in sorted(self.rejected.items())]
            for name, hist in (("time_to_first_token_seconds", self.ttft), ("inter_token_latency_seconds", self.itl),
                               ("e2e_request_latency_seconds", self.e2e)):
                lines.append(f"# TYPE {p}{name} histogram")
                lines += hist.lines(p + name)
        return "\n".join(lines) + "\n"
