"""The owner's seam to the host: one small protocol per kind of thing laned touches (the user
manager, units, containers, the engines' HTTP APIs, GPUs, the page cache, the host's facts,
weight-cache daemons, the journal, its own state files; and the peers, for the coordinator),
and `Seam`, the bundle of them the owner holds.

Each protocol reads or acts and answers with a value; none decides, and none changes a lane's
state: the owner's parts (laned.owner.supervisor) judge with laned.core and fire the lane
machine's events (laned.core.machine). `laned.owner.wiring` builds the real ones over
laned.adapters, and is the only module of the owner that imports an adapter; the owner's
fast tests (tests/unit/test_owner.py) run the same owner over fakes of each.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from laned.config.model import Config, LaneConfig, Node
from laned.core import canary
from laned.core.checkpoint import Files
from laned.core.exits import ExitRecord
from laned.core.facts import GpuReading, HostFacts, KeyFile, LaneFacts, Sleepers
from laned.core.lanes import EventKind, Refused
from laned.core.liveness import EngineSample, Unanswered
from laned.core.page_cache import Prefetched, Residency
from laned.core.saved import Saved
from laned.core.unit_state import UnitCallback, UnitSnapshot
from laned.engines.profile import WeightCacheApi
from laned.gates.acceptance import GateResult
from laned.render.plan import Action

Note = Callable[[EventKind, str], None]


class Manager(Protocol):
    """The user manager over its bus (laned.owner.bus keeps the connection)."""

    @property
    def address(self) -> str:
        """Where the user manager is reached (for messages)."""

    async def connect(self, on_change: UnitCallback, on_restart: Callable[[], None]) -> None:
        """Connect (unless connected): units' changes to `on_change`, a re-exec to `on_restart`."""

    async def subscribe(self) -> None:
        """Ask the manager for its signals again (after a reconnect)."""

    async def wait_closed(self) -> None:
        """Return when the connection drops."""

    def disconnect(self) -> None:
        """Close the connection (laned closes)."""

    async def manager_started(self) -> int:
        """When the manager started (µs): a new manager answers another."""

    async def system_state(self) -> str:
        """The manager's SystemState ("running", "stopping", ...)."""


class Units(Protocol):
    """The lanes' units: their files written and read again, their state, their jobs."""

    async def render(self, config: Config, systemd_version: int) -> list[tuple[Action, str]]:
        """Write the config's units and wrappers (laned.adapters.rendered.apply)."""

    async def reload(self) -> None:
        """daemon-reload: the rendered units read again."""

    async def ref_unit(self, unit: str) -> None:
        """Keep the unit loaded (an exited one keeps its status)."""

    async def snapshot(self, unit: str) -> UnitSnapshot:
        """The unit as the manager has it now."""

    async def start(self, unit: str) -> None:
        """Clear a failed state and start the unit (its start job ends when it runs)."""

    async def stop(self, unit: str) -> Refused | None:
        """Stop the unit and confirm the manager has it stopped."""

    async def still_ending(self, unit: str, seen: UnitSnapshot | None) -> bool:
        """Whether the unit runs or is stopping, by the manager or by what laned has seen."""

    def exit_record(self, path: str) -> ExitRecord | None:
        """The serve wrapper's record of the engine's last exit (blocking, small)."""


class Containers(Protocol):
    """Podman: a container lane's image, container and log; a lane's engine processes."""

    async def image_id(self, spec: LaneConfig) -> str | None:
        """A container lane's local image's id; None otherwise (PodmanError: unknowable)."""

    async def running_image(self, lane: str, spec: LaneConfig) -> str | None:
        """The image a container lane runs; None for other lanes or when unknowable."""

    async def prepare(self, lane: str, spec: LaneConfig, line: Callable[[str], None]) -> None:
        """Run the lane's `prepare` steps, their output to `line` (LanedError: one failed)."""

    async def container_gone(self, lane: str, spec: LaneConfig, note: Note) -> Refused | None:
        """A stopped container lane's container is gone (before the next lane starts)."""

    async def engine_pids(self, lane: str, spec: LaneConfig, control_group: str) -> set[int]:
        """Every process of the lane's engine (its unit's cgroup, a container's own)."""

    async def container(self, lane: str, spec: LaneConfig) -> dict[str, Any] | None:
        """A container lane's container as podman shows it (None for other lanes)."""

    async def container_logs(self, lane: str, spec: LaneConfig, lines: int) -> list[str]:
        """A container lane's own log (NotAContainer for other lanes)."""

    def use_podman(self, config: Config) -> None:
        """Reach podman where `config` says from now on (a reload may have changed it)."""


class Engines(Protocol):
    """The engines' HTTP APIs, each reached as its lane's engine profile says."""

    def api_key(self, spec: LaneConfig) -> str | None:
        """The lane's API key, from its secrets file (blocking, small); None without one."""

    async def health(self, port: int, path: str = "/health") -> int | None:
        """The status the engine's health endpoint answers with; None without an answer."""

    async def models(self, port: int, api_key: str | None) -> list[str] | None:
        """The model names its /v1/models lists; None when it does not answer."""

    async def accepts(self, port: int) -> bool:
        """Something accepts connections on the port."""

    async def sample(self, spec: LaneConfig) -> EngineSample | Unanswered | None:
        """Its /metrics as laned reads them; UNANSWERED: no answer; None: none of them."""

    async def sleep(self, spec: LaneConfig, level: int) -> bool | None:
        """Ask it to sleep at `level`; whether it then says it sleeps (None: it does not say)."""

    async def wake(self, spec: LaneConfig, level: int) -> bool:
        """Wake it from a sleep at `level` (what that level needs); whether it says it woke."""

    async def asleep(self, spec: LaneConfig) -> bool:
        """Whether a running lane that can sleep sleeps now (False when it cannot say)."""

    async def sleep_level(self, spec: LaneConfig) -> int | None:
        """The level the engine says it sleeps at; None when it does not say."""

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


class Gpus(Protocol):
    """The GPUs as NVML reads them (the start gate's readings, a sleep's confirmation)."""

    def unread(self) -> str | None:
        """Why the GPUs cannot be read now; None: they can ("": laned reads none at all)."""

    def read(self, indices: Sequence[int] | None) -> list[GpuReading]:
        """The GPUs of `indices` (None: all) as read now (blocking: called off the loop)."""


class PageCache(Protocol):
    """A model's files on this host, the page cache, and the memory left to fill it."""

    def weight_files(self, model: str | None) -> list[str]:
        """The model directory's weight files; [] where there is none (blocking)."""

    def checkpoint(self, model: str | None) -> Files:
        """The model's checkpoint files as stat has them now; () without one (blocking)."""

    def weights_gib(self, model: str | None) -> float | None:
        """The size of the model's local weight files (blocking)."""

    def residency(self, files: Sequence[str]) -> Residency:
        """How much of `files` is in the page cache now (blocking)."""

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
        """Read `files` into the page cache within the budget, until `stop` (blocking)."""


class Facts(Protocol):
    """This host as preflight judges it (laned.core.facts), read now."""

    async def host_facts(self) -> HostFacts:
        """The host's GPUs (NVML) and memory."""

    async def lane_facts(
        self,
        config: Config,
        lane: str,
        port_peer: str | None,
        image_id: str | None,
        sleepers: Sleepers,
    ) -> LaneFacts | None:
        """Everything preflight looks at for one lane; None where laned reads no host."""

    def port_busy(self, port: int) -> bool:
        """Whether something listens on the port (blocking)."""

    def key_file(self, path: str) -> KeyFile:
        """The secrets file as systemd would read it: a link, its owner (blocking)."""


class WeightCaches(Protocol):
    """The weight-cache daemons of the lanes that keep their weights (docs/weight-cache.md)."""

    async def start(self, lane: str, spec: LaneConfig) -> Refused | None:
        """Start the lane's daemon and confirm it serves (its job ends at /health 200)."""

    async def stop(self, lane: str, spec: LaneConfig, note: Note) -> Refused | None:
        """Stop the daemon and confirm it is gone (its container too)."""

    def digest(self, path: str) -> str | None:
        """The digest of what the running daemon loads, as its wrapper wrote it (blocking)."""

    async def held(self, path: str, cache: WeightCacheApi) -> Mapping[str, object] | None:
        """What its ranks say they hold, by socket (`cache`'s names, wire) in its record's dir."""

    async def pids(self, lane: str, spec: LaneConfig, control_group: str) -> set[int]:
        """The daemon's processes (its unit's cgroup, its container's)."""


class Journal(Protocol):
    """journald: the lanes' log lines."""

    def follow(
        self, units: Iterable[str], since: float | None, opened: Callable[[], None] | None
    ) -> AsyncIterator[tuple[str, str, float]]:
        """(unit, line, when logged) from `since` on, until cancelled (JournalUnavailable)."""

    def journald_down(self) -> str | None:
        """Why journald does not answer; None when it does (or cannot be told)."""

    async def tail(self, unit: str, lines: int) -> list[str]:
        """The unit's last log lines."""


class Writer(Protocol):
    """state.json written in the background whenever something worth keeping changed."""

    def mark(self) -> None:
        """Something worth keeping changed."""

    async def flush(self) -> None:
        """Write now what changed (an accepted request must outlive a crash of laned)."""

    def start(self) -> None:
        """Begin writing in the background (on the running loop)."""

    async def close(self) -> None:
        """Stop writing in the background; write what is still unwritten."""


class StateStore(Protocol):
    """laned's own files in its state directory: state.json, and what each lane keeps."""

    def load(self, state_dir: str) -> Saved:
        """What state.json keeps (an unreadable one moved aside, and said)."""

    def writer(
        self, state_dir: str, saved: Callable[[], Saved], trouble: Callable[[str | None], None]
    ) -> Writer:
        """state.json's writer of `saved()`; `trouble`: why a write failed, None once one works."""

    def load_checks(self, state_dir: str, lane: str) -> dict[str, Any] | None:
        """The lane's last acceptance run; None when there is none (or it is unreadable)."""

    def save_checks(self, state_dir: str, lane: str, run: dict[str, Any]) -> None:
        """Keep the lane's last acceptance run (atomically)."""

    def load_canary(self, state_dir: str, lane: str) -> dict[str, Any] | None:
        """The lane's kept canary answer; None when there is none (blocking)."""

    def save_canary(self, state_dir: str, lane: str, answer: dict[str, Any]) -> None:
        """Keep the lane's canary answer (atomically; blocking)."""

    def load_checkpoint(self, state_dir: str, lane: str) -> dict[str, Any] | None:
        """The checkpoint the lane's weights were last read from; None: none kept (blocking)."""

    def save_checkpoint(self, state_dir: str, lane: str, kept: dict[str, Any]) -> None:
        """Keep the checkpoint the lane's weights are read from now (atomically; blocking)."""


class Peers(Protocol):
    """The other hosts' laned, for lanes over several hosts (laned.owner.coordinator)."""

    async def view(self, node: Node, lane: str) -> dict[str, Any]:
        """The peer's view of its rank of the lane (PeerUnreachable: no answer)."""

    async def ask(self, node: Node, lane: str, action: str, force: bool = False) -> dict[str, Any]:
        """Ask the peer to act on its own rank only; it answers once its checks let it through."""

    async def forward(self, node: Node, lane: str, action: str, force: bool = False) -> None:
        """Hand a request for the whole lane to its head, which coordinates every rank."""

    async def sleep(self, node: Node, lane: str, step: str, level: int) -> dict[str, Any]:
        """A worker's rank around its head's sleep: `before` it reads, `after` it confirms."""

    def use_token(self, token: str | None) -> None:
        """Send this peer token from the next call on (a reload's)."""

    async def close(self) -> None:
        """Release the connections."""


class Ranks(Protocol):
    """A head's word with its workers' laned on a sleep and a wake of the lane's ranks
    (laned.owner.coordinator; docs/multinode.md): its engine sleeps and wakes every rank,
    each worker's host confirms its own."""

    def heads(self, lane: str) -> bool:
        """Whether this host is the head of the lane over several hosts."""

    async def before_sleep(self, lane: str, level: int) -> Refused | None:
        """Each worker reads what its rank holds now, before the head's engine sleeps."""

    async def after_sleep(self, lane: str, level: int) -> Refused | None:
        """Each worker confirms its rank holds less than before: asleep there too."""

    async def before_wake(self, lane: str) -> Refused | None:
        """Every worker's rank is activated and past its own gate: the head may wake."""


async def _nothing() -> None:
    """Nothing held, nothing to release."""


@dataclass(frozen=True)
class Seam:
    """The host, as the owner holds it: one protocol per kind of thing it touches. The
    supervisor hands each of its parts the protocols that part uses."""

    manager: Manager
    units: Units
    containers: Containers
    engines: Engines
    gpus: Gpus
    pages: PageCache
    facts: Facts
    weight_caches: WeightCaches
    journal: Journal
    state: StateStore
    # Release the engines' connections, NVML and the podman session (whoever built it closes).
    close: Callable[[], Awaitable[None]] = _nothing
