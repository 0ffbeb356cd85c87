"""The present-state exposition (laned.api.present), written by hand for speed: the library's
parser reads back every value, label escapes hold, and promtool finds nothing to say."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from laned.api.present import GAUGES, render_present
from laned.core.lanes import Desired, LaneStatus
from laned.core.modes import Mode


class Lanes:
    """Two lanes: `a` ready with checks, an engine and a waiting request; `b"x` (a name
    that needs escaping) a head of a lane over two hosts, failed, no engine."""

    def __init__(self) -> None:
        a = LaneStatus(
            name="a", mode=Mode.READY, desired=Desired.ACTIVE,
            last_phases={"loading weights": 12.5, 'odd "phase"\\': 1e-7},
            checks={"at": 1733370000.25, "gates": {"chat": {"passed": True}, "tools": {"passed": False}}},
        )  # fmt: skip
        b = LaneStatus(name='b"x', mode=Mode.FAILED)
        self.statuses = {"a": a, 'b"x': b}

    def engine_summary(self, lane: str) -> dict[str, float] | None:
        if lane != "a":
            return None
        return {"requests_running": 3, "requests_waiting": 1, "kv_cache_usage": 0.25, "generation_tokens_per_second": 812.5}  # fmt: skip

    def engine_info(self, lane: str) -> tuple[str, str]:
        return ("llamacpp", "tiny") if lane == "a" else ("vllm", 'm"x')

    def proxy_counts(self, lane: str) -> dict[str, float]:
        return {"in_flight": 2, "queued": 1, "oldest_wait": 7.5} if lane == "a" else {"in_flight": 0, "queued": 0, "oldest_wait": 0.0}  # fmt: skip

    def rank_view(self, lane: str) -> dict[str, Any] | None:
        if lane == "a":
            return None
        return {"rank": 0, "peers": [{"host": "h2", "rank": 1, "reachable": False}, {"host": "h3", "rank": 2}]}  # fmt: skip


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_every_value_reads_back_through_the_librarys_parser() -> None:
    text = render_present(Lanes()).decode()  # type: ignore[arg-type]
    got = samples(text)
    assert got[("laned_lane_state", (("lane", "a"), ("state", "ready")))] == 1.0
    assert got[("laned_lane_state", (("lane", "a"), ("state", "failed")))] == 0.0
    assert got[("laned_lane_state", (("lane", 'b"x'), ("state", "failed")))] == 1.0
    assert got[("laned_lane_desired_active", (("lane", "a"),))] == 1.0
    assert got[("laned_lane_ready", (("lane", 'b"x'),))] == 0.0
    assert got[("laned_lane_info", (("engine", "llamacpp"), ("lane", "a"), ("model", "tiny")))] == 1.0  # fmt: skip
    assert got[("laned_lane_info", (("engine", "vllm"), ("lane", 'b"x'), ("model", 'm"x')))] == 1.0  # fmt: skip
    assert got[("laned_cold_start_phase_seconds", (("lane", "a"), ("phase", 'odd "phase"\\')))] == 1e-7  # fmt: skip
    assert got[("laned_check_passed", (("gate", "tools"), ("lane", "a")))] == 0.0
    assert got[("laned_check_last_run_timestamp_seconds", (("lane", "a"),))] == 1733370000.25
    assert got[("laned_engine_generation_tokens_per_second", (("lane", "a"),))] == 812.5
    assert ("laned_engine_requests_running", (("lane", 'b"x'),)) not in got  # no engine
    assert got[("laned_requests_oldest_wait_seconds", (("lane", "a"),))] == 7.5
    assert got[("laned_lane_rank", (("lane", 'b"x'),))] == 0.0
    assert got[("laned_peer_up", (("host", "h2"), ("lane", 'b"x'), ("rank", "1")))] == 0.0
    assert not [
        k for k in got if k[0] == "laned_peer_up" and ("host", "h3") in k[1]
    ]  # not looked at yet
    families = {f.name for f in text_string_to_metric_families(text)}
    assert families == {*GAUGES, "laned_build_info"}


def test_promtool_finds_nothing_to_say() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing (apt-get install prometheus)"
    text = render_present(Lanes()).decode()  # type: ignore[arg-type]
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr
