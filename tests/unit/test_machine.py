"""The lane machine (laned.core.machine) as a table: every (mode, event) pair has an outcome,
every user-visible state is reached, and random event sequences keep its invariants. Pure:
no loop, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from laned.core.lanes import LaneState
from laned.core.machine import _IGNORED, _ROWS, ANY, SERVING_MODES, TABLE, Effect, Ev, Mode, decide

STARTS = {Ev.START, Ev.ADOPT, Ev.STARTED_OUTSIDE, Ev.WAKE, Ev.SYSTEMD_RESTARTS}


def test_every_pair_has_an_outcome_or_a_reason_to_ignore_it() -> None:
    assert len(TABLE) == len(Mode) * len(Ev)
    for (mode, event), outcome in TABLE.items():
        if outcome.ignored:
            assert outcome.to is None and not outcome.effects, (mode, event)
        else:
            assert outcome.to is not None or outcome.effects, (mode, event, "does nothing")


def test_every_visible_state_is_shown_by_a_mode_and_reached_by_an_event() -> None:
    assert {mode.visible for mode in Mode} == set(LaneState)
    reached = {outcome.to for outcome in TABLE.values() if outcome.to is not None}
    assert reached == set(Mode)  # no mode is only an initial value


def test_a_new_run_begins_only_with_a_start() -> None:
    for (mode, event), outcome in TABLE.items():
        if Effect.NEW_RUN in outcome.effects:
            assert event in STARTS, (mode, event)
        if event in STARTS and not outcome.ignored:
            assert Effect.NEW_RUN in outcome.effects, (mode, event)


def test_every_move_into_ready_answers_the_waiters() -> None:
    for (mode, _event), outcome in TABLE.items():
        if outcome.to is Mode.READY and mode is not Mode.READY:
            assert Effect.RESOLVE_WAITERS in outcome.effects


def test_only_a_start_becomes_ready_and_only_ready_lanes_serve_degraded() -> None:
    for (mode, event), outcome in TABLE.items():
        if outcome.to is Mode.READY:
            assert mode in {Mode.STARTING, Mode.WAKING} | SERVING_MODES, (mode, event)
        if outcome.to in SERVING_MODES - {Mode.READY}:
            assert mode is Mode.READY, (mode, event)
    assert decide(Mode.RESTARTING, Ev.READY).ignored  # an earlier run's report
    assert decide(Mode.DEGRADED_PEER, Ev.CHECK_PASSED).ignored  # not the check's doing


@dataclass
class Lane:
    """What the table's effects do to a lane, as bookkeeping: the model the sequences run on."""

    mode: Mode = Mode.INACTIVE
    run: int = 0
    restart_waiting: bool = False
    watched: int | None = None  # the run a watcher follows
    waiters: int = 0
    answered: list[str] = field(default_factory=list)

    def fire(self, event: Ev) -> None:
        outcome = decide(self.mode, event)
        if outcome.ignored:
            return
        for effect in outcome.effects:
            if effect is Effect.NEW_RUN:
                self.run += 1
            elif effect is Effect.CANCEL_RESTART:
                self.restart_waiting = False
            elif effect is Effect.SCHEDULE_RESTART:
                self.restart_waiting = True
            elif effect is Effect.FOLLOW:
                self.watched = self.run
            elif effect is Effect.UNFOLLOW:
                self.watched = None
            elif effect is Effect.RESOLVE_WAITERS:
                self.answered.append("ready")
                self.waiters = 0
            elif effect in (Effect.FAIL_WAITERS, Effect.SUPERSEDE_WAITERS):
                self.answered.append(effect.value)
                self.waiters = 0
        if outcome.to is not None:
            self.mode = outcome.to


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list(Ev)), max_size=40))
def test_random_event_sequences_keep_the_invariants(events: list[Ev]) -> None:
    lane = Lane()
    for event in events:
        before = lane.mode, lane.run
        lane.waiters += 1  # someone waits for it to be ready before each event
        lane.fire(event)
        # A stop laned asks for always wins over a restart waiting for its backoff, and
        # nothing watches the run it ends.
        if event is Ev.STOP_ASKED:
            assert not lane.restart_waiting and lane.watched is None
        # A watcher follows only the current run.
        assert lane.watched in (None, lane.run)
        # Whoever waits hears when the lane becomes ready; a failed lane tells them why,
        # unless nobody could be waiting for that run any more.
        if lane.mode is Mode.READY and before[0] is not Mode.READY:
            assert lane.answered and lane.answered[-1] == "ready" and lane.waiters == 0
        # The run number only grows, and only at a start.
        assert lane.run in (before[1], before[1] + 1)
        if lane.run != before[1]:
            assert event in STARTS and lane.mode in {Mode.STARTING, Mode.WAKING, Mode.RESTARTING}


def doc_row(event: Ev, modes: frozenset[Mode], to: Mode | None, effects: tuple[Effect, ...]) -> str:
    """A row of docs/architecture.md's table of the lane machine, as the table has it."""
    if modes == ANY:
        where = "any"
    elif len(modes) > len(Mode) / 2:
        where = "any but " + ", ".join(sorted(m.value for m in ANY - modes))
    else:
        where = ", ".join(sorted(m.value for m in modes))
    done = ", ".join(e.value for e in effects) or "—"
    return f"| `{event.value}` | {where} | {to.value if to else '(stays)'} | {done} | {_IGNORED.get(event, '')} |"  # fmt: skip


def test_the_architecture_doc_shows_the_table_as_it_is() -> None:
    """docs/architecture.md's table of the lane machine is the code's, row for row."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    missing = [row for row in (doc_row(*r) for r in _ROWS) if row not in doc.splitlines()]
    assert missing == [], "rows of the lane machine not in docs/architecture.md:\n" + "\n".join(
        missing
    )
