"""The lanes' present state in Prometheus' text exposition, written out at each scrape.

These gauges are read fresh at every scrape (a lane's state, its engine's load, the requests
that wait and how long the oldest has waited: values that move with the clock and with every
request), so nothing here may be cached. They were a prometheus_client collector, whose
families, samples and `generate_latest` cost 240 µs a scrape for three lanes; the same text
written directly costs a tenth of that (docs/performance.md). The format is the library's
(text format 0.0.4: `# HELP`, `# TYPE`, `name{label="value"} value` with the labels in name
order, values as Go prints floats: `floatToGoString`), checked against the library's parser and `promtool check metrics`
in tests/unit/test_metrics.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from prometheus_client.utils import floatToGoString

from laned import __version__
from laned.core.lanes import Desired, LaneState, LaneStatus

# name -> help, in the order they are written.
GAUGES = {
    "laned_lane_info": "1 for each lane, with its engine and served model as labels.",
    "laned_lane_state": "1 for the lane's current state.",
    "laned_lane_desired_active": "1 when the lane should run.",
    "laned_lane_ready": "1 when the lane is ready.",
    "laned_engine_requests_running": "Engine requests running.",
    "laned_engine_requests_waiting": "Engine requests waiting.",
    "laned_engine_kv_cache_usage_ratio": "Engine KV-cache usage (0-1).",
    "laned_engine_generation_tokens_per_second": "Generated tokens per second over the last minute.",
    "laned_cold_start_phase_seconds": "Duration of each startup phase of the lane's last good cold start.",
    "laned_check_passed": "1 when the gate passed at the lane's last acceptance run, 0 when it failed.",
    "laned_check_last_run_timestamp_seconds": "When the lane's acceptance gates last ran (Unix time).",
    "laned_requests_in_flight": "Requests laned's OpenAI endpoint has sent to the lane's engine, not yet answered.",
    "laned_requests_queued": "Requests at laned's OpenAI endpoint waiting for the lane to be ready.",
    "laned_requests_oldest_wait_seconds": "How long the oldest request waiting for the lane has waited (0: none waits).",
    "laned_lane_rank": "This host's rank in a lane over several hosts (0: the head).",
    "laned_start_last_seconds": "The lane's last start of each kind that became ready (cold, weight-cache, sleep): the next one's prediction.",
    "laned_weight_cache_state": "1 for the state of the lane's weight-cache daemon (docs/weight-cache.md).",
    "laned_weight_cache_bytes": "GPU memory the lane's weight-cache daemon holds, by its own word.",
    "laned_peer_up": "On a lane's head: 1 when the worker's laned answered at the last look.",
}
SUMMARY = {  # the engine summary's keys, by gauge
    "laned_engine_requests_running": "requests_running",
    "laned_engine_requests_waiting": "requests_waiting",
    "laned_engine_kv_cache_usage_ratio": "kv_cache_usage",
    "laned_engine_generation_tokens_per_second": "generation_tokens_per_second",
}
BUILD = (
    "# HELP laned_build_info laned's version.\n# TYPE laned_build_info gauge\n"
    f'laned_build_info{{version="{__version__}"}} 1.0\n'
)
STATES = tuple(LaneState)
WEIGHTS_STATES = ("loading", "ready", "stopping", "stopped", "failed")


class LaneSource(Protocol):
    """What the metrics read at a scrape: the lanes' statuses and their engines' load."""

    @property
    def statuses(self) -> Mapping[str, LaneStatus]:
        """Every lane's status."""

    def engine_summary(self, lane: str) -> dict[str, float] | None:
        """The engine's load, for running lanes."""

    def engine_info(self, lane: str) -> tuple[str, str]:
        """(the lane's engine, its served model name), as it runs."""

    def proxy_counts(self, lane: str) -> dict[str, float]:
        """The lane's requests at laned's OpenAI endpoint: in flight, queued."""

    def rank_view(self, lane: str) -> dict[str, Any] | None:
        """A lane over several hosts: this host's rank and, on the head, its workers."""


def _value(number: float) -> str:
    """A sample's value as the library writes it (Go's float format: 1.0, 1e-07, +Inf)."""
    return str(floatToGoString(number))  # type: ignore[no-untyped-call]


def _label(value: str) -> str:
    """A label value as the text format escapes it."""
    if "\\" in value or "\n" in value or '"' in value:
        value = value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def render_present(source: LaneSource) -> bytes:
    """Every present-state gauge of every lane, as one exposition."""
    lines: dict[str, list[str]] = {name: [] for name in GAUGES}
    value = _value
    for name, status in sorted(source.statuses.items()):
        lane = f'lane="{_label(name)}"'
        engine, model = source.engine_info(name)
        lines["laned_lane_info"].append(
            f'laned_lane_info{{engine="{_label(engine)}",{lane},model="{_label(model)}"}} 1.0'
        )
        ranks = source.rank_view(name)
        if ranks is not None:
            lines["laned_lane_rank"].append(f"laned_lane_rank{{{lane}}} {value(ranks['rank'])}")
            for peer in ranks["peers"] or ():
                if "reachable" in peer:
                    up = 1.0 if peer["reachable"] else 0.0
                    host, rank = _label(peer["host"]), peer["rank"]
                    lines["laned_peer_up"].append(
                        f'laned_peer_up{{host="{host}",{lane},rank="{rank}"}} {value(up)}'
                    )
        counts = source.proxy_counts(name)
        lines["laned_requests_in_flight"].append(
            f"laned_requests_in_flight{{{lane}}} {value(counts['in_flight'])}"
        )
        lines["laned_requests_queued"].append(
            f"laned_requests_queued{{{lane}}} {value(counts['queued'])}"
        )
        lines["laned_requests_oldest_wait_seconds"].append(
            f"laned_requests_oldest_wait_seconds{{{lane}}} {value(counts['oldest_wait'])}"
        )
        lines["laned_lane_state"] += [
            f'laned_lane_state{{{lane},state="{each.value}"}} {"1.0" if status.state is each else "0.0"}'
            for each in STATES
        ]
        desired = "1.0" if status.desired is Desired.ACTIVE else "0.0"
        lines["laned_lane_desired_active"].append(f"laned_lane_desired_active{{{lane}}} {desired}")
        for phase, seconds in sorted(status.last_phases.items()):
            lines["laned_cold_start_phase_seconds"].append(
                f'laned_cold_start_phase_seconds{{{lane},phase="{_label(phase)}"}} {value(seconds)}'
            )
        if status.checks:
            lines["laned_check_last_run_timestamp_seconds"].append(
                f"laned_check_last_run_timestamp_seconds{{{lane}}} {value(float(status.checks.get('at', 0.0)))}"
            )
            for gate, result in sorted(status.checks.get("gates", {}).items()):
                passed = "1.0" if result.get("passed") else "0.0"
                lines["laned_check_passed"].append(
                    f'laned_check_passed{{gate="{_label(gate)}",{lane}}} {passed}'
                )
        for kind, seconds in sorted(status.last_starts.items()):
            lines["laned_start_last_seconds"].append(
                f'laned_start_last_seconds{{kind="{_label(kind)}",{lane}}} {value(seconds)}'
            )
        if status.weights is not None:
            lines["laned_weight_cache_state"] += [
                f'laned_weight_cache_state{{{lane},state="{each}"}} {"1.0" if status.weights == each else "0.0"}'
                for each in WEIGHTS_STATES
            ]
            if status.weights_held is not None:
                lines["laned_weight_cache_bytes"].append(
                    f"laned_weight_cache_bytes{{{lane}}} {value(status.weights_held)}"
                )
        ready = "1.0" if status.state is LaneState.READY else "0.0"
        lines["laned_lane_ready"].append(f"laned_lane_ready{{{lane}}} {ready}")
        summary = source.engine_summary(name)
        if summary is not None:
            for gauge, key in SUMMARY.items():
                lines[gauge].append(f"{gauge}{{{lane}}} {value(summary[key])}")
    out = [BUILD]
    for name, text in GAUGES.items():
        out.append(f"# HELP {name} {text}\n# TYPE {name} gauge\n")
        if lines[name]:
            out.append("\n".join(lines[name]) + "\n")
    return "".join(out).encode()
