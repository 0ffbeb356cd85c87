"""The reliability suite runs `laned serve` as its own process over the harness (the real user
manager, journald, the simulator), as an operator runs it. Each test prints one `FIGURES`
line that docs/reliability.md quotes from the last run."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.common import LanedServe
from tests.helpers import ROOT, free_port
from tests.integration import conftest as integration
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import FAST, lane_config

# The harness's fixtures, for this directory too.
harness, units, sim_image = integration.harness, integration.units, integration.sim_image


@pytest.fixture
def swap_pair(daemon: Any) -> Any:
    """A factory: lanes `a` and `b` of one group on one port, `a` the default and running;
    `daemon_toml` adds to [daemon]."""

    def start(daemon_toml: str = "") -> LanedServe:
        port = free_port()
        lanes = {"a": FAST, "b": FAST}
        return daemon(
            lanes, daemon_toml=f'default_lane = "a"\n{daemon_toml}', ports={"a": port, "b": port}
        )  # type: ignore[no-any-return]

    return start


def unit_property(harness: Harness, name: str, unit: str) -> str:
    """One property of a unit, as the user manager has it (MainPID, ActiveState ...)."""
    return subprocess.run(
        ["systemctl", "--user", "show", "-p", name, "--value", unit],
        env=harness.env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


def harness_up(harness: Harness) -> None:
    """`scripts/harness up`: whatever a test killed of the harness (the user manager,
    journald) runs again."""
    up = subprocess.run(
        [str(ROOT / "scripts" / "harness"), "up"], env=harness.env, capture_output=True, text=True
    )
    assert up.returncode == 0, up.stderr


def lane_view(url: str, name: str) -> dict[str, Any]:
    """One lane as GET /lanes shows it."""
    lanes = httpx.get(f"{url}/lanes", timeout=10).json()["lanes"]
    return next(v for v in lanes if v["name"] == name)  # type: ignore[no-any-return]


def notices(url: str) -> list[str]:
    """laned's notices, as /healthz shows them."""
    return httpx.get(f"{url}/healthz", timeout=10).json()["notices"]  # type: ignore[no-any-return]


def figures(name: str, **values: object) -> None:
    """One line of figures for docs/reliability.md (shown with `pytest -s` or on failure)."""
    print(f"FIGURES {name} {json.dumps(values, sort_keys=True)}")


@pytest.fixture
def daemon(harness: Harness, units: Units, tmp_path: Path) -> Iterator[object]:
    """A factory: daemon(lanes, daemon_toml="", ready=1, headers=None, api=None, **lane_config's) -> a
    running LanedServe (laned serve on tmp_path/laned.toml, its log in tmp_path/laned.log)."""
    started: list[LanedServe] = []

    def start(
        lanes: dict[str, str],
        daemon_toml: str = "",
        ready: int = 1,
        headers: dict[str, str] | None = None,
        api: int | None = None,
        **kw: object,
    ) -> LanedServe:
        api = api or free_port()
        lane_config(harness, units, tmp_path, lanes, free_port(), **kw)  # type: ignore[arg-type]
        path = tmp_path / "laned.toml"
        text = path.read_text().replace(
            'listen = "127.0.0.1:1"\n', f'listen = "127.0.0.1:{api}"\n{daemon_toml}', 1
        )
        path.write_text(text)
        serve = LanedServe(path, api, harness.env, list(units.names), ready, headers)
        started.append(serve.__enter__())
        return serve

    yield start
    for serve in started:
        serve.__exit__()


RUNNING = {"active", "activating", "deactivating", "reloading"}
SAMPLE_EVERY = 0.02  # seconds between two readings of the units' states


class Sampler(threading.Thread):
    """Each lane unit's ActiveState every 20 ms; `overlaps` counts samples with both lanes of
    one group running."""

    def __init__(self, harness: Harness, groups: dict[str, list[str]]) -> None:
        super().__init__(daemon=True)
        self.harness, self.groups, self.done = harness, groups, False
        self.samples = self.overlaps = 0

    def run(self) -> None:
        units = [u for pair in self.groups.values() for u in pair]
        while not self.done:
            out = subprocess.run(
                ["systemctl", "--user", "show", "-p", "ActiveState", "--value", *units],
                env=self.harness.env, capture_output=True, text=True, check=False,
            ).stdout.split()  # fmt: skip
            if len(out) == len(units):
                state = dict(zip(units, out, strict=True))
                self.samples += 1
                for pair in self.groups.values():
                    self.overlaps += all(state[u] in RUNNING for u in pair)
            time.sleep(SAMPLE_EVERY)
