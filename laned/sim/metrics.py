"""The simulated engine's /metrics: vLLM V1 names and labels, in Prometheus text format 0.0.4.

Written without prometheus_client (the simulator runs on a bare Python) but laid out the
way prometheus_client writes it, as vLLM's own /metrics is: HELP and TYPE lines, counters
ending in `_total` with a `_created` gauge beside them, histograms with `_bucket`/`_sum`/
`_count` and `_created`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


def _labels(pairs: dict[str, str]) -> str:
    if not pairs:
        return ""
    inner = ",".join(
        f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34)).replace(chr(10), "")}"'
        for k, v in sorted(pairs.items())
    )
    return "{" + inner + "}"


def _num(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    return repr(float(value))


@dataclass
class Histogram:
    """A cumulative histogram with fixed buckets."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0
    created: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        """Record one observation."""
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.count += 1


@dataclass
class Metrics:
    """Every number the engine exports; mutated by the engine, rendered on scrape."""

    model_name: str
    spec_decode: bool = False
    num_spec_tokens: int = 0
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    legacy: bool = False  # also vllm:gpu_cache_usage_perc, as vLLM 0.9 and 0.10 export it
    counters: dict[str, float] = field(default_factory=dict)
    finished: dict[str, int] = field(default_factory=lambda: {"stop": 0, "length": 0, "abort": 0})
    accepted_per_pos: list[int] = field(default_factory=list)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    extra: Callable[[dict[str, str], Callable[..., None]], None] | None = None  # more families

    COUNTERS: ClassVar[dict[str, str]] = {
        "prompt_tokens": "Number of prefill tokens processed.",
        "generation_tokens": "Number of generation tokens processed.",
        "num_preemptions": "Cumulative number of preemption from the engine.",
        "prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
        "prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    }
    SPEC_COUNTERS: ClassVar[dict[str, str]] = {
        "spec_decode_num_drafts": "Number of spec decoding drafts.",
        "spec_decode_num_draft_tokens": "Number of draft tokens.",
        "spec_decode_num_accepted_tokens": "Number of accepted tokens.",
    }
    HISTOGRAMS: ClassVar[dict[str, tuple[str, tuple[float, ...]]]] = {
        "time_to_first_token_seconds": (
            "Histogram of time to first token in seconds.",
            LATENCY_BUCKETS,
        ),
        "inter_token_latency_seconds": (
            "Histogram of inter-token latency in seconds.",
            LATENCY_BUCKETS,
        ),
        "e2e_request_latency_seconds": (
            "Histogram of e2e request latency in seconds.",
            LATENCY_BUCKETS,
        ),
        "request_queue_time_seconds": (
            "Histogram of time spent in WAITING phase for request.",
            LATENCY_BUCKETS,
        ),
        "request_prefill_time_seconds": (
            "Histogram of time spent in PREFILL phase for request.",
            LATENCY_BUCKETS,
        ),
        "request_decode_time_seconds": (
            "Histogram of time spent in DECODE phase for request.",
            LATENCY_BUCKETS,
        ),
        # Observed every engine step, prefill-only chunks too (with 0: their prompt tokens are
        # counted when the prefill ends) — vllm/v1/metrics/loggers.py.
        "iteration_tokens_total": (
            "Histogram of number of tokens per engine_step.",
            (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
        ),
        "request_prompt_tokens": ("Number of prefill tokens processed.", TOKEN_BUCKETS),
        "request_generation_tokens": ("Number of generation tokens processed.", TOKEN_BUCKETS),
    }

    def __post_init__(self) -> None:
        names = list(self.COUNTERS) + list(self.SPEC_COUNTERS)
        self.counters = dict.fromkeys(names, 0.0)
        self.histograms = {name: Histogram(b) for name, (_, b) in self.HISTOGRAMS.items()}
        self.accepted_per_pos = [0] * self.num_spec_tokens

    def add(self, name: str, amount: float) -> None:
        """Increase a counter."""
        self.counters[name] += amount

    def observe(self, name: str, value: float) -> None:
        """Record a histogram observation."""
        self.histograms[name].observe(value)

    def render(self) -> str:
        """The exposition text for one scrape."""
        base = {"model_name": self.model_name, "engine": "0"}
        out: list[str] = []

        def family(
            name: str,
            kind: str,
            help_text: str,
            samples: Sequence[tuple[str, dict[str, str], float]],
        ) -> None:
            out.append(f"# HELP vllm:{name} {help_text}")
            out.append(f"# TYPE vllm:{name} {kind}")
            out.extend(
                f"vllm:{sample}{_labels(labels)} {_num(value)}" for sample, labels, value in samples
            )

        family(
            "num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            [("num_requests_running", base, self.running)],
        )
        family(
            "num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            [("num_requests_waiting", base, self.waiting)],
        )
        family(
            "kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            [("kv_cache_usage_perc", base, self.kv_usage)],
        )
        if self.legacy:
            family(
                "gpu_cache_usage_perc",
                "gauge",
                "GPU KV-cache usage. 1 means 100 percent usage."
                "DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
                [("gpu_cache_usage_perc", base, self.kv_usage)],
            )
        counters = dict(self.COUNTERS)
        if self.spec_decode:
            counters.update(self.SPEC_COUNTERS)
        for name, help_text in counters.items():
            family(
                f"{name}_total",
                "counter",
                help_text,
                [(f"{name}_total", base, self.counters[name])],
            )
            family(f"{name}_created", "gauge", help_text, [(f"{name}_created", base, self.created)])
        reasons = [
            ("request_success_total", {**base, "finished_reason": r}, n)
            for r, n in self.finished.items()
        ]
        family(
            "request_success_total", "counter", "Count of successfully processed requests.", reasons
        )
        created = [
            ("request_success_created", {**base, "finished_reason": r}, self.created)
            for r in self.finished
        ]
        family(
            "request_success_created", "gauge", "Count of successfully processed requests.", created
        )
        if self.spec_decode:
            per_pos = [
                (
                    "spec_decode_num_accepted_tokens_per_pos_total",
                    {**base, "position": str(i)},
                    float(n),
                )
                for i, n in enumerate(self.accepted_per_pos)
            ]
            family(
                "spec_decode_num_accepted_tokens_per_pos_total",
                "counter",
                "Accepted tokens per draft position.",
                per_pos,
            )
        for name, (help_text, _) in self.HISTOGRAMS.items():
            hist = self.histograms[name]
            samples: list[tuple[str, dict[str, str], float]] = [
                (f"{name}_bucket", {**base, "le": _num(float(bound))}, float(count))
                for bound, count in zip(hist.buckets, hist.counts, strict=True)
            ]
            samples.append((f"{name}_bucket", {**base, "le": "+Inf"}, hist.count))
            samples += [(f"{name}_count", base, hist.count), (f"{name}_sum", base, hist.total)]
            family(name, "histogram", help_text, samples)
            family(f"{name}_created", "gauge", help_text, [(f"{name}_created", base, hist.created)])
        if self.extra is not None:
            self.extra(base, family)
        out.append("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig")
        out.append("# TYPE vllm:cache_config_info gauge")
        out.append(f"vllm:cache_config_info{_labels({'engine': '0', 'block_size': '16'})} 1.0")
        return "\n".join(out) + "\n"
