"""Operations: one activate, deactivate or restart under way per lane, generation-stamped.

The newest request for a lane supersedes the operation under way on it, and an activation
supersedes those of the lanes it takes off (laned.owner.requests): their tasks are
cancelled and their callers hear `Superseded`. Cancelling alone is not trusted: after every
await an operation asks `check()`, which raises Superseded once it is no longer current —
llama-swap's rule that "a read that gates a mutation is a bug", kept by construction.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Coroutine
from dataclasses import dataclass, field

from laned.core.lanes import Desired, LaneStatus
from laned.core.policy import Current, OpKind, SwapResult
from laned.core.recorder import Recorder
from laned.errors import Finding, LanedError, Superseded
from laned.owner.ledger import new_future


@dataclass
class Operation:
    """An activate, deactivate or restart in progress for one lane."""

    lane: str
    kind: OpKind
    generation: int  # 0: runs alongside another lane's operation, never current itself
    future: asyncio.Future[LaneStatus]
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    from_lane: str = "none"
    started: float = field(default_factory=time.monotonic)
    force: bool = False  # start despite preflight errors, stop without draining requests
    unattended: bool = False  # laned's own (at start): a refusal fails the lane, visibly
    findings: list[Finding] | None = None  # a preflight its caller already ran
    desired_before: dict[str, Desired] = field(default_factory=dict)  # restored if refused
    evicts: tuple[str, ...] = ()  # the lanes an activation takes off (laned.core.placement)
    stops_asleep: tuple[str, ...] = ()  # of those, the sleepers whose residual is in the way


class Operations:
    """The operation under way of each lane."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.current: dict[str, Operation] = {}  # lane -> its operation
        self.aside: dict[str, Operation] = {}  # lane -> its stop alongside another's activation
        self._generation = 0

    def of(self, lane: str) -> Operation | None:
        """The lane's operation under way."""
        return self.current.get(lane)

    def view(self, lane: str) -> Current | None:
        """The lane's operation as policy sees it."""
        op = self.current.get(lane)
        return None if op is None else Current(op.lane, op.kind)

    def evicting(self, lane: str) -> Operation | None:
        """The activation under way that takes `lane` off, if one does."""
        return next((op for op in self.current.values() if lane in op.evicts), None)

    def busy(self, lanes: Collection[str]) -> bool:
        """Whether an operation works on any of `lanes` (its own, or an activation taking it off)."""
        return any(op.lane in lanes or set(op.evicts) & set(lanes) for op in self.current.values())

    def begin(self, lane: str, kind: OpKind) -> Operation:
        """A new operation, current for its lane from now on."""
        self._generation += 1
        op = Operation(lane, kind, self._generation, new_future())
        self.current[lane] = op
        return op

    def alongside(self, lane: str, kind: OpKind) -> Operation:
        """An operation that runs beside another lane's without displacing it (a stop of a
        lane that an activation takes off anyway); a newer activation of its own lane
        supersedes it (`aside`)."""
        op = Operation(lane, kind, 0, new_future())
        self.aside[lane] = op
        return op

    @staticmethod
    def run(op: Operation, coro: Coroutine[object, object, None]) -> asyncio.Task[None]:
        """Run a step of the operation as a task that a supersession cancels."""
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        op.tasks.add(task)
        task.add_done_callback(op.tasks.discard)
        return task

    def is_current(self, op: Operation) -> bool:
        """Whether the operation is still its lane's current one."""
        return self.current.get(op.lane) is op

    def ensure_current(self, op: Operation) -> None:
        """After an await: go on only while the operation is current."""
        if not self.is_current(op):
            raise Superseded(
                f"{op.kind.value} {op.lane} was replaced by a newer request",
                "the newest request wins",
            )

    def supersede(self, op: Operation, why: str) -> None:
        """A newer request wins: cancel the operation's tasks, tell its caller."""
        me = asyncio.current_task()
        for task in list(op.tasks):
            if task is not me:
                task.cancel()
        error = Superseded(why, "the newest request wins")
        self._record_swap(op, error)
        if not op.future.done():
            op.future.set_exception(error)
        self._forget(op)

    def finish(self, op: Operation, status: LaneStatus, error: LanedError | None) -> None:
        """The operation ended: its caller hears the lane's status or the error."""
        self._record_swap(op, error)
        if not op.future.done():
            if error is None:
                op.future.set_result(status)
            else:
                op.future.set_exception(error)
        self._forget(op)

    def _forget(self, op: Operation) -> None:
        for table in (self.current, self.aside):
            if table.get(op.lane) is op:
                del table[op.lane]

    def cancel_all(self) -> list[asyncio.Task[None]]:
        """Cancel every operation's tasks (laned is stopping); the tasks, to wait for."""
        ops = [*self.current.values(), *self.aside.values()]
        tasks = [t for op in ops for t in op.tasks]
        for task in tasks:
            task.cancel()
        return tasks

    def _record_swap(self, op: Operation, error: BaseException | None) -> None:
        if op.kind is not OpKind.ACTIVATE or op.future.done():
            return
        if error is None:
            result = SwapResult.READY
        elif isinstance(error, Superseded):
            result = SwapResult.SUPERSEDED
        else:
            result = SwapResult.FAILED
        self.recorder.swap(op.from_lane, op.lane, result.value, time.monotonic() - op.started)
