"""The owner's one seam to the host: everything the owner (laned.owner.supervisor) asks of
systemd, podman, NVML, the page cache and the engines goes through this protocol, and nothing
else reaches an adapter from the owner's parts.

`laned.owner.steps.HostSeam` is the real one (over laned.adapters); the owner's fast tests
(tests/unit/test_owner.py) run the same owner over a fake that implements this and nothing
else. Each method answers with a value and changes no lane state: the owner fires the lane
machine's events (laned.core.machine) with what it hears. Stops are always confirmed.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from laned.config.model import Config, LaneConfig
from laned.core import canary
from laned.core.checkpoint import Files
from laned.core.exits import ExitRecord
from laned.core.gpu_memory import Asleep
from laned.core.lanes import EventKind, LaneState, Refused
from laned.core.liveness import EngineSample, Unanswered
from laned.core.page_cache import Prefetched, Residency
from laned.core.recorder import Recorder
from laned.core.unit_state import UnitCallback, UnitSnapshot
from laned.errors import Finding
from laned.gates.acceptance import GateResult
from laned.preflight.facts import NO_SLEEPERS, HostFacts, Sleepers
from laned.render.plan import Action

Note = Callable[[EventKind, str], None]


@dataclass(frozen=True)
class Beside:
    """The lanes that run on beside a lane that starts: their processes (pid -> lane), whose
    GPU memory the gate leaves to them, and the room (bytes, by GPU index) the starting
    lane's footprint needs there (laned.core.placement)."""

    staying: Mapping[int, str]
    room: Mapping[int, int]
    lanes: tuple[str, ...] = ()  # the staying lanes on its GPUs, by name


ALONE = Beside({}, {})


class Seam(Protocol):
    """What the owner does on the host, and what it asks of it."""

    # --- the user manager (laned.owner.bus keeps the connection) --------------------------------

    @property
    def address(self) -> str:
        """Where the user manager is reached (for messages)."""

    def connected(self) -> bool:
        """The connection to the user manager is up."""

    async def connect(self, on_change: UnitCallback, on_restart: Callable[[], None]) -> None:
        """Connect (unless connected); a unit's PropertiesChanged goes to `on_change`, the
        manager's re-exec or restart to `on_restart`."""

    async def subscribe(self) -> None:
        """Ask the manager for its signals again (after a reconnect)."""

    async def wait_closed(self) -> None:
        """Returns when the connection drops."""

    def disconnect(self) -> None:
        """Close the connection (laned closes)."""

    async def manager_started(self) -> int:
        """When the manager started (µs): a new manager answers another."""

    async def system_state(self) -> str:
        """The manager's SystemState ("running", "stopping", ...)."""

    async def render(self, config: Config, systemd_version: int) -> list[tuple[Action, str]]:
        """The config's units and wrappers written (laned.adapters.rendered.apply)."""

    async def reload(self) -> None:
        """daemon-reload: the rendered units read again."""

    async def ref_unit(self, unit: str) -> None:
        """Keep the unit loaded (an exited one keeps its status)."""

    async def snapshot(self, unit: str) -> UnitSnapshot:
        """The unit as the manager has it now."""

    # --- units -----------------------------------------------------------------------------------

    async def start(self, unit: str) -> None:
        """Clear a failed state and start the unit (the start job ends when it runs)."""

    async def stop(self, unit: str) -> Refused | None:
        """Stop the unit and confirm the manager has it stopped."""

    async def still_ending(self, unit: str, seen: UnitSnapshot | None) -> bool:
        """Whether the unit runs or is stopping, by the manager or by what laned has seen."""

    async def container_gone(self, lane: str, spec: LaneConfig, note: Note) -> Refused | None:
        """A stopped container lane's container is gone (before the next lane starts)."""

    def exit_record(self, path: str) -> ExitRecord | None:
        """The serve wrapper's record of the engine's last exit (blocking, small)."""

    # --- the weight-cache daemon of a lane that keeps its weights (docs/weight-cache.md) ----------

    async def start_weights(self, lane: str, spec: LaneConfig) -> Refused | None:
        """Start the lane's weight-cache daemon and confirm it serves (its start job ends when
        its /health answers 200); why not, or None."""

    async def stop_weights(self, lane: str, spec: LaneConfig, note: Note) -> Refused | None:
        """Stop the daemon and confirm it is gone (its container too)."""

    def weights_digest(self, path: str) -> str | None:
        """The digest of what the running daemon loads, as its wrapper wrote it (blocking)."""

    async def weights_held(self, path: str, pattern: str) -> Mapping[str, object] | None:
        """What the daemon's ranks say they hold on the GPUs, by socket, asked over the
        sockets (`pattern`, its engine's) in the directory its wrapper's record (`path`)
        names, as said (the owner judges it: laned.core.footprints.held_of); None: no
        answer."""

    async def weights_pids(self, lane: str, spec: LaneConfig, control_group: str) -> set[int]:
        """The daemon's processes (its unit's cgroup, its container's): the engine's start
        gate leaves the GPU memory they hold to them."""

    def follow_logs(
        self, units: Iterable[str], since: float | None, opened: Callable[[], None] | None
    ) -> AsyncIterator[tuple[str, str, float]]:
        """(unit, message, when logged) for the units' log lines from `since` (default:
        now), until cancelled; JournalUnavailable when they cannot be read."""

    # --- the start gate and what runs -----------------------------------------------------------

    async def preflight(
        self,
        config: Config,
        lane: str,
        states: Mapping[str, LaneState],
        image_id: str | None,
        sleepers: Sleepers = NO_SLEEPERS,
    ) -> list[Finding]:
        """The lane's preflight findings as of now."""

    async def clear_for_start(
        self,
        lane: str,
        spec: LaneConfig,
        last_image: str | None,
        note: Note,
        recorder: Recorder,
        waking: bool = False,
        sleepers: Collection[int] = (),
        beside: Beside = ALONE,
    ) -> Refused | None:
        """Before a start: `prepare` after an image change, the GPU memory released (but the
        lanes staying `beside` it) with room for it, the port free (before a wake: the GPU
        memory only). Why the lane cannot start, or None."""

    async def engine_pids(self, lane: str, spec: LaneConfig, control_group: str) -> set[int]:
        """Every process of the lane's engine (its unit's cgroup, a container's own)."""

    async def running_image(self, lane: str, spec: LaneConfig) -> str | None:
        """The image a container lane runs; None for other lanes or when unknowable."""

    def use_podman(self, config: Config) -> None:
        """Reach podman where `config` says from now on (a reload may have changed it)."""

    # --- the engines ------------------------------------------------------------------------------

    def api_key(self, spec: LaneConfig) -> str | None:
        """The lane's API key, from its secrets file (blocking, small); None without one."""

    async def health(self, port: int, path: str = "/health") -> int | None:
        """The status the engine's health endpoint answers with; None without an answer."""

    async def models(self, port: int, api_key: str | None) -> list[str] | None:
        """The model names its /v1/models lists; None when it does not answer."""

    async def accepts(self, port: int) -> bool:
        """Something accepts connections on the port."""

    async def sample(self, spec: LaneConfig) -> EngineSample | Unanswered | None:
        """Its /metrics, as laned reads them (running, waiting, tokens); UNANSWERED when the
        engine gave no answer; None when it answered without them."""

    async def sleep(
        self, lane: str, spec: LaneConfig, seen: UnitSnapshot | None, note: Note, level: int
    ) -> Refused | Asleep:
        """Put the engine to sleep at `level` and confirm it."""

    async def wake(self, spec: LaneConfig, level: int) -> Refused | None:
        """Wake the engine asleep at `level` and confirm it."""

    async def asleep(self, spec: LaneConfig) -> bool:
        """Whether a running lane that can sleep sleeps now (False when it cannot say)."""

    async def sleep_level(self, spec: LaneConfig) -> int | None:
        """The level the engine says it sleeps at; None when it does not say."""

    def sleep_level_now(self, spec: LaneConfig, pinned: bool = False) -> tuple[int, str]:
        """The level the lane sleeps at now, and why when not its own (blocking)."""

    async def canary(self, spec: LaneConfig) -> canary.Answer:
        """The engine's answer to the canary prompt (LanedError when it cannot answer)."""

    async def run_checks(
        self,
        spec: LaneConfig,
        gates: Sequence[str],
        last_cold_start: float | None,
        on_result: Callable[[GateResult], None],
    ) -> list[GateResult]:
        """Run acceptance gates against the lane's engine."""

    # --- the host, read (the front's views: laned.owner.supervisor's read methods) -----------

    def journald_down(self) -> str | None:
        """Why journald does not answer; None when it does (or cannot be told)."""

    async def log_tail(self, unit: str, lines: int) -> list[str]:
        """The unit's last log lines, from journald."""

    async def container(self, lane: str, spec: LaneConfig) -> dict[str, Any] | None:
        """A container lane's container as podman shows it (None for other lanes)."""

    async def container_logs(self, lane: str, spec: LaneConfig, lines: int) -> list[str]:
        """A container lane's own log (NotAContainer for other lanes)."""

    async def facts(self) -> HostFacts:
        """The host's GPUs (NVML) and memory."""

    def weights_gib(self, model: str | None) -> float | None:
        """The size of the model's local weight files (blocking)."""

    async def close(self) -> None:
        """Release the engines' connections, NVML and the podman session."""

    # --- the page cache (blocking: called off the loop) -----------------------------------------

    def weight_files(self, model: str | None) -> list[str]:
        """The model directory's weight files; [] where there is none."""

    def checkpoint(self, model: str | None) -> Files:
        """The model's checkpoint as the file system has it now: each weight and config
        file's path, size, mtime and inode, by stat alone (no weight read); () without a
        local model."""

    def residency(self, files: Sequence[str]) -> Residency:
        """How much of `files` is in the page cache now."""

    def mem_available(self) -> float | None:
        """The host's MemAvailable, in bytes; None where it cannot be read."""

    def read_ahead(
        self,
        files: Sequence[str],
        budget_bytes: int,
        max_bytes_per_s: float,
        stop: threading.Event,
        memory_left: Callable[[], float],
    ) -> Prefetched:
        """Read `files` into the page cache within the budget, until `stop`."""
