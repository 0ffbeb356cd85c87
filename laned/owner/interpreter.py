"""The lane machine's one runner: every input of every lane goes through `post`, which asks
the pure step (laned.core.machine.step) for the lane's next record and its effects, replaces
the record in the book (laned.owner.book), and runs the effects (laned.core.effects) in order.

Bookkeeping effects are done at once: a transition or a note published, the run watched or
not (the bound watcher, laned.owner.reactions), a restart timer set or dropped, the lane's
waiters and a request's callers answered, a figure counted, an input posted to another lane.
A request's sequence (`Begin`, `Then`, `End`) runs as one task per lane: each action is done
on the host by laned.owner.actions and answered by a result input, posted here like any other
input, before the next. A newer request's sequence ends the older one; the older one's
results are stale by then (their epoch), and the step drops them.

Nothing else changes a lane: the other parts of the owner post inputs and read records.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Protocol

from laned import errors
from laned.core import effects as fx
from laned.core import inputs as i
from laned.core.lanes import Event, LaneStatus
from laned.core.machine import Context, Step, step
from laned.core.recorder import Recorder
from laned.owner.book import Book, new_future

log = logging.getLogger("laned.supervisor")


class Acting(Protocol):
    """What the interpreter asks of the host for each action (laned.owner.actions.Actions)."""

    async def do(self, lane: str, action: fx.Action, epoch: int) -> i.Result:
        """Do `action` for the lane's request `epoch`; its result."""


class Hands(Protocol):
    """What the interpreter runs beside the sequences (laned.owner.supervisor binds them)."""

    def watch(self, lane: str, run: int) -> Coroutine[object, object, None]:
        """Follow the run: readiness, then liveness."""

    def task(self, lane: str, what: str, reason: str) -> Coroutine[object, object, None] | None:
        """Work beside the sequence (laned.core.effects.Task)."""

    def prefetch(self, lane: str, what: str, taking_off: tuple[str, ...]) -> None:
        """Read ahead, stop, or measure at the start (laned.core.effects.Prefetch)."""

    def context(self, lane: str, epoch: int) -> Context:
        """What the step reads beside the record (the clock, the lane's config)."""


@dataclass
class _Sequence:
    """A request's actions under way for one lane."""

    epoch: int
    rest: collections.deque[fx.Action]
    task: asyncio.Task[None] | None = None
    ended: bool = False


class Interpreter:
    """Posts inputs through the step and runs what it asks."""

    def __init__(
        self,
        book: Book,
        actions: Acting,
        hands: Hands,
        recorder: Callable[[], Recorder],
        spawn: Callable[[Coroutine[object, object, None]], asyncio.Task[None]],
    ) -> None:
        self.book, self.actions, self.hands, self._recorder = book, actions, hands, recorder
        self.spawn = spawn  # the owner's tasks (laned.owner.records): cancelled at close
        self.closing = False
        self._epoch = 0
        self._sequences: dict[str, _Sequence] = {}
        self._callers: dict[int, list[asyncio.Future[LaneStatus]]] = {}
        self._waiters: dict[str, list[asyncio.Future[LaneStatus]]] = {}
        self._peers: dict[tuple[str, int, str], asyncio.Future[i.Result]] = {}
        self.follows: dict[str, asyncio.Task[None]] = {}
        self.restarts: dict[str, asyncio.TimerHandle] = {}
        self.pokes: dict[str, asyncio.Event] = {}
        self.alarms: dict[str, asyncio.Event] = {}

    # --- the one way in ------------------------------------------------------------------------

    def epoch(self) -> int:
        """A fresh epoch: a request's own number (its results carry it)."""
        self._epoch += 1
        return self._epoch

    def post(self, lane: str, event: i.Input) -> Step:
        """`event` for `lane`: stepped, the record replaced, the effects run. The step's
        answer (ignored and refused pairs are logged and change nothing)."""
        record = self.book.statuses.get(lane)
        if record is None:
            return Step(LaneStatus(lane), ignored="no such lane (removed by a reload)")
        answer = step(record, event, self.hands.context(lane, self.epoch()))
        said = (type(event).__name__, record.mode.value)
        if answer.refused:  # a pair only a bug brings: said, and its request ends (the step's)
            log.error("%s: %s refused in %s: %s", lane, *said, answer.refused)
        elif answer.ignored:
            log.debug("%s: %s ignored in %s: %s", lane, *said, answer.ignored)
        if answer.lane is not record:
            self.book.replace(lane, answer.lane)
        for effect in answer.effects:
            self._run(lane, effect)
        return answer

    # --- callers and waiters -------------------------------------------------------------------

    def caller(self, epoch: int) -> asyncio.Future[LaneStatus]:
        """A future for the caller of request `epoch`: the lane's record when it is done, or
        the error that ends it."""
        future = new_future()
        self._callers.setdefault(epoch, []).append(future)
        return future

    def wait_ready(self, lane: str) -> asyncio.Future[LaneStatus]:
        """A future that resolves when the lane is ready (at once if it is)."""
        future = new_future()
        record = self.book.statuses[lane]
        if record.mode.value == "ready":
            future.set_result(record)
        else:
            self._waiters.setdefault(lane, []).append(future)
        return future

    def fail_waiters(self, lane: str, reason: str) -> None:
        """The lane is gone (a reload removed it): everyone waiting hears so."""
        self._fail_waiters(lane, fx.FailWaiters(reason))

    def under_way(self, lane: str) -> bool:
        """A sequence of a request runs for the lane now."""
        seq = self._sequences.get(lane)
        return seq is not None and not seq.ended

    # --- effects --------------------------------------------------------------------------------

    def _run(self, lane: str, effect: fx.Effect) -> None:
        if isinstance(effect, fx.Moved):
            self.book.publish(Event(self.book.clock(), lane, effect.was, effect.now, effect.reason))
        elif isinstance(effect, fx.Noted):
            self.book.note(lane, effect.kind, effect.text)
        elif isinstance(effect, fx.Follow):
            self._follow(lane)
        elif isinstance(effect, fx.Unfollow):
            self._unfollow(lane)
        elif isinstance(effect, fx.CancelRestart):
            timer = self.restarts.pop(lane, None)
            if timer is not None:
                timer.cancel()
        elif isinstance(effect, fx.ScheduleRestart):
            loop = asyncio.get_running_loop()
            self.restarts[lane] = loop.call_later(effect.delay, self._backoff_over, lane)
        elif isinstance(effect, fx.ResolveWaiters):
            record = self.book.statuses[lane]
            for waiter in self._waiters.pop(lane, []):
                if not waiter.done():
                    waiter.set_result(record)
        elif isinstance(effect, fx.FailWaiters):
            self._fail_waiters(lane, effect)
        elif isinstance(effect, fx.Answer):
            self._answer(lane, effect)
        elif isinstance(effect, fx.Count):
            self._count(effect)
        elif isinstance(effect, fx.Post):
            self._post(effect.lane, effect.input)
        elif isinstance(effect, fx.Poke):
            self.poke(lane).set()
        elif isinstance(effect, fx.Alarm):
            self.alarm(lane).set()
        elif isinstance(effect, fx.Prefetch):
            self.hands.prefetch(lane, effect.what, effect.taking_off)
        elif isinstance(effect, fx.Task):
            coro = self.hands.task(lane, effect.what, effect.reason)
            if coro is not None:
                self.spawn(coro)
        elif isinstance(effect, fx.Begin):
            self._begin(lane, effect.actions)
        elif isinstance(effect, fx.Then):
            seq = self._sequences.get(lane)
            if seq is not None and not seq.ended:
                seq.rest = collections.deque(effect.actions)
        elif isinstance(effect, fx.End):
            self._end(lane)
        else:
            raise errors.LanedError(f"{lane}: no way to run {effect!r}")

    def _count(self, effect: fx.Count) -> None:
        """A figure for laned's metrics, by the Recorder method the effect names."""
        r = self._recorder()
        methods: dict[str, Callable[..., None]] = {
            "exit": r.exit,
            "restart": r.restart,
            "failure": r.failure,
            "swap": r.swap,
            "probe_failure": r.probe_failure,
            "stall": r.stall,
            "start": r.start,
            "cold_start": r.cold_start,
            "sleep_mode": r.sleep_mode,
            "preflight_refused": r.preflight_refused,
        }
        methods[effect.what](*effect.args)

    def _fail_waiters(self, lane: str, effect: fx.FailWaiters) -> None:
        for waiter in self._waiters.pop(lane, []):
            if waiter.done():
                continue
            if effect.superseded:
                waiter.set_exception(
                    errors.Superseded(
                        f"lane {lane}: {effect.reason}", "the newest request for a group wins"
                    )
                )
            else:
                waiter.set_exception(
                    errors.ActivationFailed(
                        f"lane {lane}: {effect.reason}", f"see `laned logs {lane}`"
                    )
                )

    def _answer(self, lane: str, effect: fx.Answer) -> None:
        record = self.book.statuses.get(lane)
        for epoch in effect.epochs:
            for future in self._callers.pop(epoch, []):
                if future.done():
                    continue
                if effect.error is None:
                    future.set_result(record if record is not None else LaneStatus(lane))
                    continue
                kind = getattr(errors, effect.error)
                if kind is errors.PreflightFailed:
                    error = kind(effect.message, effect.hint, list(effect.findings))
                else:
                    error = kind(effect.message, effect.hint)
                future.set_exception(error)

    def _post(self, lane: str, event: i.Input) -> None:
        """An input for another lane; a peer's answer to an activation waiting for it goes
        to that waiting action."""
        if isinstance(event, (i.PeerOff, i.PeerStuck)):
            waiting = self._peers.pop((lane, event.epoch, event.peer), None)
            if waiting is not None and not waiting.done():
                waiting.set_result(event)
            return
        self.post(lane, event)

    def take_off(
        self, activator: str, epoch: int, peer: str, event: i.TakeOff
    ) -> asyncio.Future[i.Result]:
        """Post a take-off to `peer` for `activator`'s request `epoch`; a future of the
        peer's answer (at once when it is off already)."""
        future: asyncio.Future[i.Result] = asyncio.get_running_loop().create_future()
        self._peers[(activator, epoch, peer)] = future
        answer = self.post(peer, event)
        if answer.ignored or answer.refused:  # off its GPUs already
            self._peers.pop((activator, epoch, peer), None)
            future.set_result(i.PeerOff(epoch, peer))
        return future

    # --- the sequences ----------------------------------------------------------------------

    def _begin(self, lane: str, actions: tuple[fx.Action, ...]) -> None:
        self._end(lane)
        op = self.book.statuses[lane].op
        if op is None or not actions:
            return
        seq = _Sequence(op.epoch, collections.deque(actions))
        self._sequences[lane] = seq
        seq.task = self.spawn(self._sequence(lane, seq))

    def _end(self, lane: str) -> None:
        seq = self._sequences.pop(lane, None)
        if seq is None:
            return
        seq.ended = True
        seq.rest.clear()
        if seq.task is not None and seq.task is not asyncio.current_task():
            seq.task.cancel()

    async def _sequence(self, lane: str, seq: _Sequence) -> None:
        """Each action of the sequence in turn, its result posted before the next."""
        try:
            while seq.rest and not seq.ended:
                action = seq.rest.popleft()
                result = await self.actions.do(lane, action, seq.epoch)
                if seq.ended:
                    return
                answer = self.post(lane, result)
                if answer.ignored or answer.refused:
                    return  # the request waits on what the lane's mode waits for, or ended
        except asyncio.CancelledError:
            raise
        except errors.LanedError as exc:
            # An action that broke (a call to systemd failed: the bus lost, say): its request
            # fails, and the lane stays where it is (laned.owner.outages catches it up).
            log.warning("%s: %s broke: %s", lane, type(action).__name__, exc.message)
            self._broken(lane, seq, exc)
        except Exception as exc:  # a bug: the caller still hears, and the log has it
            log.exception("%s: %s failed", lane, type(action).__name__)
            self._broken(lane, seq, errors.ActivationFailed(f"lane {lane}: laned failed: {exc!r}"))
        finally:
            if self._sequences.get(lane) is seq and not seq.rest:
                self._sequences.pop(lane, None)
                seq.ended = True

    def _broken(self, lane: str, seq: _Sequence, exc: errors.LanedError) -> None:
        self.post(lane, i.Broken(seq.epoch, type(exc).__name__, exc.message, exc.hint))

    def _backoff_over(self, lane: str) -> None:
        self.restarts.pop(lane, None)
        if not self.closing:
            self.post(lane, i.BackoffOver())

    # --- watchers -------------------------------------------------------------------------------

    def _follow(self, lane: str) -> None:
        self._unfollow(lane)
        run = self.book.statuses[lane].run
        self.follows[lane] = self.spawn(self.hands.watch(lane, run))

    def _unfollow(self, lane: str) -> None:
        task = self.follows.pop(lane, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def poke(self, lane: str) -> asyncio.Event:
        """The lane's "look again now" for its readiness watcher."""
        return self.pokes.setdefault(lane, asyncio.Event())

    def alarm(self, lane: str) -> asyncio.Event:
        """The lane's "its engine says it is dying" for its liveness watcher."""
        return self.alarms.setdefault(lane, asyncio.Event())

    def watching(self, lane: str) -> bool:
        """A watcher follows the lane's run now."""
        task = self.follows.get(lane)
        return task is not None and not task.done()

    def restart_waiting(self, lane: str) -> bool:
        """A restart after a failure waits for its backoff."""
        return lane in self.restarts

    def close(self) -> None:
        """laned closes: no restart fires any more (the tasks are the owner's to cancel)."""
        self.closing = True
        for timer in self.restarts.values():
            timer.cancel()
