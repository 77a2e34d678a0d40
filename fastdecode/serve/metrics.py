"""Prometheus text for `/metrics`: counters, gauges and histograms under vLLM's names with the `fastdecode:` prefix
(vLLM writes `vllm:`) and vLLM's `model_name` label on every sample, so dashboards made for vLLM read them with the
prefix changed."""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque

PREFIX = "fastdecode:"
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0)

HELP = {  # every metric's `# HELP` line
    "num_requests_running": "Requests whose rows are in the running batch.",
    "num_requests_waiting": "Requests queued for the engine.",
    "prompt_tokens_total": "Prompt tokens of the requests that finished.",
    "generation_tokens_total": "Tokens generated and kept (up to EOS; a diffusion row's committed tokens).",
    "avg_generation_throughput_toks_per_s": "Generated tokens per second over the last 10 seconds.",
    "spec_decode_num_drafts_total": "Verification steps that checked drafted tokens.",
    "spec_decode_num_draft_tokens_total": "Drafted tokens proposed for verification.",
    "spec_decode_num_accepted_tokens_total": "Drafted tokens the target model accepted.",
    "spec_decode_num_accepted_tokens_per_pos": "Drafted tokens accepted at each draft position.",
    "request_success_total": "Requests answered in full, by finish reason (stop, length).",
    "request_aborted_total": "Requests ended early: cancelled (the client went away) or timeout (--timeout).",
    "request_rejected_total": "Requests refused before queueing (queue_full, shutting_down).",
    "time_to_first_token_seconds": "Per request: from arrival to its first generated token.",
    "inter_token_latency_seconds": "Per row: between two engine steps that gave the row tokens.",
    "e2e_request_latency_seconds": "Per request: from arrival to its end (answered, cancelled or timed out).",
}


def _labels(base: str, **extra: str) -> str:
    parts = [base] + [f'{k}="{v}"' for k, v in extra.items()]
    return "{" + ",".join(parts) + "}"


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

    def lines(self, name: str, base: str) -> list[str]:
        """`base` is the label every sample carries (`model_name="..."`)."""
        out, total = [], 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            total += n
            out.append(f"{name}_bucket{_labels(base, le=str(bound))} {total}")
        out.append(f"{name}_bucket{_labels(base, le='+Inf')} {self.count}")
        out += [f"{name}_sum{_labels(base)} {self.sum}", f"{name}_count{_labels(base)} {self.count}"]
        return out


class Metrics:
    """Thread-safe: the engine thread records, the HTTP handlers read."""

    def __init__(self, model_name: str = "") -> None:
        self.model_name = model_name
        self.lock = threading.Lock()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos: list[int] = []
        self.success: dict[str, int] = {}
        self.aborted: dict[str, int] = {}  # requests ended early by reason (cancelled, timeout)
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

    def ended_early(self, reason: str, e2e: float) -> None:
        """A request cancelled or timed out: counted, and its end-to-end latency observed like any other's."""
        with self.lock:
            self.aborted[reason] = self.aborted.get(reason, 0) + 1
            self.e2e.observe(e2e)

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
        base = f'model_name="{_escape(self.model_name)}"'
        lab = _labels(base)
        with self.lock:
            now = time.monotonic()
            self._trim(now)
            span = now - self.recent[0][0] if len(self.recent) > 1 else 0.0
            rate = sum(n for _, n in self.recent) / span if span > 0 else 0.0
            lines: list[str] = []

            def head(name: str, kind: str) -> None:
                lines.extend((f"# HELP {p}{name} {HELP[name]}", f"# TYPE {p}{name} {kind}"))

            for name, kind, value in (
                ("num_requests_running", "gauge", self.running), ("num_requests_waiting", "gauge", self.waiting),
                ("prompt_tokens_total", "counter", self.prompt_tokens),
                ("generation_tokens_total", "counter", self.generation_tokens),
                ("avg_generation_throughput_toks_per_s", "gauge", f"{rate:.3f}"),
                ("spec_decode_num_drafts_total", "counter", self.num_drafts),
                ("spec_decode_num_draft_tokens_total", "counter", self.num_draft_tokens),
                ("spec_decode_num_accepted_tokens_total", "counter", self.num_accepted_tokens),
            ):
                head(name, kind)
                lines.append(f"{p}{name}{lab} {value}")
            head("spec_decode_num_accepted_tokens_per_pos", "counter")
            lines += [f"{p}spec_decode_num_accepted_tokens_per_pos{_labels(base, position=str(k))} {n}"
                      for k, n in enumerate(self.accepted_per_pos)]
            for name, label, counts in (("request_success_total", "finished_reason", self.success),
                                        ("request_aborted_total", "reason", self.aborted),
                                        ("request_rejected_total", "reason", self.rejected)):
                head(name, "counter")
                lines += [f"{p}{name}{_labels(base, **{label: r})} {n}" for r, n in sorted(counts.items())]
            for name, hist in (("time_to_first_token_seconds", self.ttft), ("inter_token_latency_seconds", self.itl),
                               ("e2e_request_latency_seconds", self.e2e)):
                head(name, "histogram")
                lines += hist.lines(p + name, base)
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    """A Prometheus label value: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
