"""Lanes over several hosts: the head's laned coordinates the ranks (docs/multinode.md).

- A request for the whole lane (activate, deactivate, restart) made on a worker's host is
  handed to the head. The head asks every worker's laned to act on its own rank
  (`?rank_only=true`, with the peer token); each worker runs its own preflight, GPU gate and
  drain. Then the head acts on its own rank. A worker that cannot be reached refuses an
  activation before anything starts: the head would wait for it at the rendezvous forever.
- The head watches its workers every few seconds while the lane is desired:
  - a worker's laned that does not answer leaves the lane `degraded` with the reason, and
    nothing is restarted for it;
  - a worker whose rank is not desired as the head's is (a host that booted, a missed call)
    is asked again: the head's desire wins;
  - once every worker answers again, the lane is `ready` again.
- A rank that dies takes the others with it by vLLM's own coupling: the head's engine dies
  when a worker goes away, and a worker exits when its head does. Each host's laned restarts
  its own rank, and the ranks meet again at the rendezvous. The head's backoff and crash-loop
  rule pace the lane, because a worker waits for its head.
- A worker's laned starts its rank at boot only when the head asks (resume.plan_reconcile).
- A lane that sleeps (its engine's head sleeps every rank: vLLM's collective_rpc): around
  the head's sleep each worker reads what its rank holds, then confirms it holds less, and
  its rank is a sleeper of its own host; before the head's wake every worker's rank is
  activated and past its own GPU gate (`Ranks`, laned.owner.seam).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from laned.config.model import LaneConfig, Node
from laned.config.ranks import rank_here
from laned.core.gpu_memory import confirm_sleep
from laned.core.lanes import Desired, EventKind, LaneStatus, Refused
from laned.core.modes import Mode
from laned.engines import for_lane
from laned.errors import BadRequest, PeerUnreachable, RankNotAsleep
from laned.owner.seam import Peers

if TYPE_CHECKING:
    from laned.owner.supervisor import Supervisor

log = logging.getLogger("laned.coordinator")
INTERVAL = 2.0  # seconds between the head's looks at its workers
# How long the head waits, before its wake, for each worker's rank to clear its own GPUs (its
# activation stops what runs there in the lane's group first: their drain and stop).
WAKE_WAIT = 300.0


class Coordinator:
    """The ranks of this host's lanes over several hosts, kept as one."""

    def __init__(self, supervisor: Supervisor, peers: Peers, interval: float = INTERVAL) -> None:
        """`peers`: the other hosts' laned, called with the peer token
        (laned.owner.wiring.peers)."""
        self.supervisor = supervisor
        self.peers = peers
        self.interval = interval
        self.seen: dict[str, dict[int, dict[str, Any]]] = {}  # lane -> rank -> what it showed
        self._tasks: list[asyncio.Task[None]] = []
        self._asking: set[str] = set()  # lanes whose workers are being asked, now
        # A worker's host: what its rank held when its head was about to sleep (pids, bytes
        # by GPU), kept until the head asks it to confirm the sleep.
        self._held: dict[str, tuple[set[int], dict[int, int] | None]] = {}
        # Its word with the other hosts, where the owner's parts need it: the daemons' group
        # (a lane's weight cache), a sleep and a wake of every rank (laned.owner.seam.Ranks).
        supervisor.weights.apart = self.daemons_apart
        supervisor.actions.ranks = self

    def spec(self, lane: str) -> LaneConfig:
        return self.supervisor.config.lanes[lane]

    def rank(self, lane: str) -> int | None:
        """This host's rank in the lane; None for a lane of this host alone."""
        return rank_here(self.supervisor.config, lane) if self.spec(lane).nodes else None

    def workers(self, lane: str) -> list[tuple[int, Node]]:
        return list(enumerate(self.spec(lane).nodes))[1:]

    # --- requests ----------------------------------------------------------------------

    async def ask_head(self, lane: str, action: str, force: bool) -> None:
        """A worker's host: hand the request for the whole lane to the head, which calls
        this host back for its own rank before it answers."""
        head = self.spec(lane).nodes[0]
        self.supervisor.note(lane, EventKind.PEER, f"{action}: asked the head, {head.host}")
        await self.peers.forward(head, lane, action, force)

    async def ask_workers(self, lane: str, action: str, force: bool) -> None:
        """The head: every worker acts on its own rank. An activation is refused, with
        nothing started, when a worker cannot be reached; a stop goes on regardless."""
        self._asking.add(lane)  # no look meanwhile: the head's own desire changes after this
        try:
            await self._ask_workers(lane, action, force)
        finally:
            self._asking.discard(lane)

    async def _ask_workers(self, lane: str, action: str, force: bool) -> None:
        if action == "activate":
            for _, node in self.workers(lane):
                await self.peers.view(node, lane)  # PeerUnreachable: refuse before any start
        for rank, node in self.workers(lane):
            try:
                await self.peers.ask(node, lane, action, force)
                self.supervisor.note(lane, EventKind.PEER, f"{action}: rank {rank} on {node.host}")
            except PeerUnreachable as exc:
                if action == "activate":
                    raise
                self.supervisor.note(lane, EventKind.PEER, f"{action}: rank {rank}: {exc.message}")

    # --- a sleep and a wake of every rank (the head's side: laned.owner.seam.Ranks) ----------

    def heads(self, lane: str) -> bool:
        """Whether this host is the head of the lane over several hosts."""
        return lane in self.supervisor.config.lanes and self.rank(lane) == 0

    async def before_sleep(self, lane: str, level: int) -> Refused | None:
        """Each worker reads what its rank holds, before the head's engine sleeps."""
        return await self._every_worker(lane, "before", level)

    async def after_sleep(self, lane: str, level: int) -> Refused | None:
        """Each worker confirms its rank holds less than before: asleep there too. One that
        cannot confirm leaves the sleep refused: the head stops the lane instead, and its
        next look stops that worker's rank."""
        return await self._every_worker(lane, "after", level)

    async def _every_worker(self, lane: str, step: str, level: int) -> Refused | None:
        for rank, node in self.workers(lane):
            try:
                await self.peers.sleep(node, lane, step, level)
            except PeerUnreachable as exc:
                return Refused(f"rank {rank} on {node.host}: {exc.message}", exc.hint)
            if step == "after":
                said = f"rank {rank} on {node.host} asleep (level {level}), confirmed there"
                self.supervisor.note(lane, EventKind.PEER, said)
        return None

    async def before_wake(self, lane: str) -> Refused | None:
        """Every worker's rank activated (the head's activation asked each first) and past
        its own GPU gate, so the head's wake finds their GPUs clear."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAKE_WAIT
        for rank, node in self.workers(lane):
            while True:
                try:
                    view = await self.peers.view(node, lane)
                except PeerUnreachable as exc:
                    return Refused(f"wake: rank {rank} on {node.host}: {exc.message}", exc.hint)
                state = view.get("state")
                if state in ("ready", "degraded"):
                    break
                if state in ("failed", "inactive"):
                    return Refused(
                        f"wake: rank {rank} on {node.host} is {state}, not ready for its "
                        "head's wake",
                        f"see `laned events` on {node.host}",
                    )
                if loop.time() > deadline:
                    return Refused(
                        f"wake: rank {rank} on {node.host} is still {state} after "
                        f"{WAKE_WAIT:g}s: its GPUs are not clear for its head's wake",
                        f"see `laned events` on {node.host}",
                    )
                await asyncio.sleep(0.2)
        return None

    # --- a sleep of this rank (a worker's side) ------------------------------------------

    async def rank_sleep(self, lane: str, step: str, level: int) -> dict[str, Any]:
        """A worker's rank as its head sleeps every rank: `before`, what it holds now is
        kept; `after`, it must hold less (laned.core.gpu_memory.confirm_sleep), and it is a
        sleeper of this host from then on (RankNotAsleep: why not)."""
        rank = self.rank(lane)
        if not rank:
            raise BadRequest(
                f"lane {lane}: this host is not a worker rank of it",
                "only a head's laned asks its workers' ranks to sleep",
            )
        if step == "before":
            self._held[lane] = pids, held = await self.supervisor.rank_held(lane)
            return {"lane": lane, "rank": rank, "held": held}
        pids, before = self._held.pop(lane, (set(), None))
        now, after = await self.supervisor.rank_held(lane)
        spec = self.supervisor.engine_spec(lane)
        slept = confirm_sleep(level, None, pids or now, before, after, for_lane(spec).unreleased)
        if isinstance(slept, Refused):
            raise RankNotAsleep(f"lane {lane} rank {rank}: {slept.reason}", slept.hint)
        why = self.supervisor.rank_asleep(lane, level, pids or now, slept.residual)
        if why:
            raise RankNotAsleep(f"lane {lane} rank {rank}: {why}", "see `laned events`")
        if slept.said:
            self.supervisor.note(lane, EventKind.SLEEP, f"{slept.said} (with its head)")
        return {"lane": lane, "rank": rank, "held": after}

    # --- watching ----------------------------------------------------------------------

    def start(self) -> None:
        """Watch the workers of every lane this host heads."""
        for lane in self.supervisor.config.lanes:
            if self.rank(lane) == 0:
                self._tasks.append(asyncio.ensure_future(self._watch(lane)))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.peers.close()

    async def _watch(self, lane: str) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.look(lane)
            except Exception:  # a look that fails must not end the watch
                log.exception("watching the workers of %s", lane)

    async def look(self, lane: str) -> None:
        """One look at every worker of a lane this host heads (see the module's rules)."""
        status: LaneStatus = self.supervisor.statuses[lane]
        trouble = None
        seen = self.seen.setdefault(lane, {})
        for rank, node in self.workers(lane):
            try:
                view = await self.peers.view(node, lane)
            except PeerUnreachable as exc:
                seen[rank] = {
                    "rank": rank,
                    "host": node.host,
                    "reachable": False,
                    "error": exc.message,
                }
                trouble = trouble or f"peer {node.host} (rank {rank}) unreachable: {exc.message}"
                continue
            seen[rank] = {
                "rank": rank,
                "host": node.host,
                "reachable": True,
                "state": view.get("state"),
                "desired": view.get("desired"),
                "phase": view.get("phase"),
            }
            desired = status.desired  # as it is now, after the await
            if lane in self._asking or self.supervisor.statuses[lane].mode is Mode.FALLING_ASLEEP:
                # A coordinated request, or a sleep, is under way: it sets every rank itself.
                return
            if view.get("desired") != desired.value:
                action = "activate" if desired is Desired.ACTIVE else "deactivate"
                try:
                    await self.peers.ask(node, lane, action)
                    self.supervisor.note(
                        lane, EventKind.PEER, f"{action}: rank {rank} on {node.host} (converging)"
                    )
                except PeerUnreachable as exc:
                    trouble = trouble or f"peer {node.host} (rank {rank}) refused: {exc.message}"
        if status.desired is Desired.ACTIVE:
            self.supervisor.peer_trouble(lane, trouble)

    async def daemons_apart(self, lane: str) -> str | None:
        """Why this host's running weight-cache daemon must start again before its engine maps
        from it: another rank's daemon is not ready (it died, or started again and waits at
        the daemons' rendezvous). vLLM's daemons form their group once, at
        `--master-addr:--weight-cache-master-port` (weight_cache/daemon.py
        WeightCacheDaemon.load_model: init_distributed_environment), and nothing lets a
        restarted one join a group that formed already: it would wait there until torch's
        timeout while ours serves on. None where every peer's daemon is ready, or a peer
        cannot be asked (its rank waits at the engine's rendezvous, and the look at the
        workers says it)."""
        here = self.rank(lane)
        for rank, node in enumerate(self.spec(lane).nodes):
            if rank == here:
                continue
            try:
                view = await self.peers.view(node, lane)
            except PeerUnreachable:
                continue
            state = (view.get("weight_cache") or {}).get("state")
            if state != "ready":
                return (
                    f"the weight-cache daemon of rank {rank} on {node.host} is {state}: the "
                    "hosts' daemons form their group together, so this host's restarts too "
                    "and reads the weights again"
                )
        return None

    def peers_of(self, lane: str) -> list[dict[str, Any]]:
        """What the head last saw of each worker (for the view)."""
        return [
            self.seen.get(lane, {}).get(r, {"rank": r, "host": n.host})
            for r, n in self.workers(lane)
        ]
