"""The lane machine (laned.core.machine) as a table and a pure step: every (mode, input) pair is
listed, acts or says why not; random input sequences keep its invariants. No loop, no I/O."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from hypothesis import given, settings
from hypothesis import strategies as st

from laned.core import effects as fx
from laned.core import inputs as i
from laned.core.exits import ExitFacts
from laned.core.lanes import Desired, LaneStatus
from laned.core.machine import JOURNAL_LAG, TABLE, Context, Ignore, Refuse, Step, step
from laned.core.modes import SERVING_MODES, STOP_MODES, LaneState, Mode
from laned.core.phases import DYING, Seen
from laned.validation.load import parse_config

SPEC = parse_config(
    '[lanes.a]\nport = 8001\nserved_model_name = "a"\nrestart_sec = "1s"\nstart_limit_burst = 3\n'
    '[lanes.a.exec]\ncommand = ["vllm", "serve", "/m"]\n',
    "t.toml",
    {"HOME": "/home/op"},
).lanes["a"]


def ctx(now: float = 100.0, epoch: int = 900) -> Context:
    return Context(now=now, mono=now, spec=SPEC, epoch=epoch)


def inputs() -> Iterator[type[i.Input]]:
    for value in vars(i).values():
        if (
            isinstance(value, type)
            and issubclass(value, i.Input)
            and value not in (i.Input, i.Result)
        ):
            yield value


def test_every_pair_of_mode_and_input_is_listed_and_says_why_when_it_does_not_act() -> None:
    assert set(TABLE) == set(inputs())
    for kind, row in TABLE.items():
        assert set(row) == set(Mode), kind
        for mode, cell in row.items():
            if isinstance(cell, (Ignore, Refuse)) and isinstance(cell, Ignore):
                assert cell.why, (kind, mode)


REQUEST_ROWS = {"Activate", "Deactivate", "Restart", "Superseded", "Desire"}
RUN_RECORDS = {"PhaseSeen", "WeightsAtStart", "WeightsSeen", "Checking", "Checked", "UnitSeen"}


def test_few_inputs_act_in_every_mode_and_what_is_seen_is_refused_or_ignored_somewhere() -> None:
    """Requests (the newest wins over whatever the lane does), the records of a run (tagged
    with its run) and the results of a request's own actions (tagged with its epoch: a
    request goes on from whatever mode the lane was moved to) may act in every mode, each
    row saying why in the table; everything laned sees of a lane (an exit, readiness, a
    probe, a stop outside laned...) is mode-bound, and each row of it says no somewhere."""
    everywhere = {k.__name__ for k, row in TABLE.items() if all(callable(c) for c in row.values())}
    results = {k.__name__ for k in TABLE if issubclass(k, i.Result)}
    assert everywhere <= REQUEST_ROWS | RUN_RECORDS | results, everywhere - REQUEST_ROWS - results
    seen = [k for k in TABLE if k.__name__ not in REQUEST_ROWS | RUN_RECORDS | results]
    assert len(seen) >= 18
    for kind in seen:
        cells = TABLE[kind].values()
        assert any(isinstance(c, (Ignore, Refuse)) for c in cells), kind.__name__
    refused = sum(isinstance(c, Refuse) for row in TABLE.values() for c in row.values())
    ignored = sum(isinstance(c, Ignore) for row in TABLE.values() for c in row.values())
    assert refused > 30 and ignored > 100, (refused, ignored)


def test_every_visible_state_is_shown_by_a_mode_and_the_state_is_derived() -> None:
    assert {mode.visible for mode in Mode} == set(LaneState)
    for mode in Mode:
        lane = LaneStatus("a", mode=mode)
        assert lane.state is mode.visible
        assert lane.stopping == (mode in STOP_MODES)
        assert lane.serving == (mode in SERVING_MODES)


def test_the_record_is_immutable() -> None:
    lane = LaneStatus("a")
    try:
        lane.mode = Mode.READY  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("a record must not be assigned")
    try:
        lane.last_starts["cold"] = 1.0  # type: ignore[index]
    except TypeError:
        pass
    else:
        raise AssertionError("a record's maps are read-only")


def test_a_result_of_an_older_request_and_a_report_of_an_older_run_are_stale() -> None:
    lane = LaneStatus("a", mode=Mode.READY, run=3)
    assert step(lane, i.Drained(7), ctx()).ignored.startswith("a result of an earlier")
    assert step(lane, i.Ready(2, "ok", None), ctx()).ignored == "a report of an earlier run"


def test_a_refused_pair_keeps_the_record_and_says_so() -> None:
    lane = LaneStatus("a", mode=Mode.INACTIVE, op=None)
    found = step(lane, i.FoundAsleep("d", 1, frozenset()), ctx())
    assert found.lane.mode is Mode.SLEEPING  # allowed while inactive
    asleep = found.lane
    again = step(asleep, i.FoundAsleep("d", 1, frozenset()), ctx())
    assert again.refused and again.lane is asleep and not again.effects


def activate(lane: LaneStatus, epoch: int = 1, **kw: object) -> Step:
    return step(lane, i.Activate(epoch, "activate", **kw), ctx())  # type: ignore[arg-type]


def test_an_activation_runs_preflight_then_its_peers_then_its_own_start() -> None:
    began = activate(LaneStatus("a"), evicts=("b",))
    assert began.lane.desired is Desired.ACTIVE and began.lane.op is not None
    (seq,) = [e for e in began.effects if isinstance(e, fx.Begin)]
    assert [type(a).__name__ for a in seq.actions] == ["RunPreflight", "TakePeerOff", "CheckEnding"]
    lane = began.lane
    lane = step(lane, i.Preflighted(1, (), 0, None), ctx()).lane
    lane = step(lane, i.PeerOff(1, "b"), ctx()).lane
    then = step(lane, i.Ending(1, False), ctx())
    (rest,) = [e for e in then.effects if isinstance(e, fx.Then)]
    assert [type(a).__name__ for a in rest.actions] == [
        "CheckWeights", "Gate", "StartWeights", "StartUnit",
    ]  # fmt: skip
    lane = step(then.lane, i.WeightsStale(1, None), ctx()).lane
    started = step(lane, i.Cleared(1, None), ctx())
    assert started.lane.mode is Mode.STARTING and started.lane.run == 1
    # Watched once its unit runs, not before (a worker rank shows nothing else).
    assert not any(isinstance(e, fx.Follow) for e in started.effects)
    up = step(started.lane, i.WeightsUp(1, "", None), ctx())
    unit = step(up.lane, i.UnitStarted(1), ctx())
    assert any(isinstance(e, fx.Follow) for e in unit.effects)
    ready = step(unit.lane, i.Ready(1, "health 200", "img"), ctx(101.5))
    assert ready.lane.mode is Mode.READY and ready.lane.op is None
    assert ready.lane.last_cold_start == 1.5 and ready.lane.image_id == "img"
    answers = [e for e in ready.effects if isinstance(e, fx.Answer)]
    assert answers == [fx.Answer((1,))]
    assert any(isinstance(e, fx.ResolveWaiters) for e in ready.effects)


def starting(epoch: int = 1) -> LaneStatus:
    """Lane `a` in the middle of its activation's start: cleared by the gate, its unit not
    started yet."""
    lane = activate(LaneStatus("a"), epoch).lane
    for result in (i.Preflighted(epoch, (), 0, None), i.Ending(epoch, False)):
        lane = step(lane, result, ctx()).lane
    lane = step(lane, i.WeightsStale(epoch, None), ctx()).lane
    lane = step(lane, i.Cleared(epoch, None), ctx()).lane
    assert lane.mode is Mode.STARTING and lane.op is not None
    return lane


def answered(effects: tuple[fx.Effect, ...], epoch: int = 1) -> list[str | None]:
    return [e.error for e in effects if isinstance(e, fx.Answer) and epoch in e.epochs]


def test_an_operators_stop_in_the_middle_of_a_start_answers_the_activation() -> None:
    up = step(starting(), i.UnitStarted(1), ctx()).lane
    off = step(up, i.StoppedOutside("stopped outside laned", False), ctx())
    assert off.lane.mode is Mode.INACTIVE and off.lane.op is None
    assert answered(off.effects) == ["ActivationFailed"]


def test_a_failure_in_the_middle_of_a_start_restarts_within_its_request() -> None:
    up = step(starting(), i.UnitStarted(1), ctx()).lane
    died = step(up, i.Failing(1, "the daemon died", "weights", "weights"), ctx())
    assert died.lane.mode is Mode.RESTART_STOPPING and died.lane.op is not None
    assert died.lane.op.epoch == 1 and not answered(died.effects)  # its caller still waits
    (seq,) = [e for e in died.effects if isinstance(e, fx.Begin)]
    assert "StopUnit" in [type(a).__name__ for a in seq.actions]


def test_a_lane_superseded_in_the_middle_of_its_start_is_stopped_not_left_starting() -> None:
    won = step(starting(), i.Superseded("superseded by activate b"), ctx(epoch=7))
    assert answered(won.effects) == ["Superseded"]
    assert won.lane.op is not None and won.lane.op.kind == "settle"
    (seq,) = [e for e in won.effects if isinstance(e, fx.Begin)]
    assert [type(a).__name__ for a in seq.actions] == ["CheckEnding"]


def test_an_action_that_breaks_in_the_middle_of_a_start_fails_the_lane() -> None:
    broke = step(starting(), i.Broken(1, "LanedError", "StartUnit: unit masked", ""), ctx())
    assert broke.lane.mode is Mode.FAILED and broke.lane.op is None
    assert answered(broke.effects) == ["ActivationFailed"]
    assert any(isinstance(e, fx.FailWaiters) for e in broke.effects)


def test_an_action_broken_by_the_bus_away_leaves_the_start_for_the_catch_up() -> None:
    broke = step(starting(), i.Broken(1, "BusUnavailable", "the user bus was lost", ""), ctx())
    assert broke.lane.mode is Mode.STARTING and broke.lane.op is None  # outages catch it up
    assert answered(broke.effects) == ["ActivationFailed"]


def test_a_restart_whose_unit_outlived_its_stop_fails_and_tells_its_waiters() -> None:
    lane = LaneStatus("a", mode=Mode.READY, run=1, desired=Desired.ACTIVE)
    lane = step(lane, i.Restart(5, "restart requested", "requested"), ctx()).lane
    lane = step(lane, i.Drained(5), ctx()).lane
    kept = step(lane, i.UnitStopped(5, i.Refused("the unit is still active", "")), ctx())
    assert kept.lane.mode is Mode.FAILED and kept.lane.op is None
    assert any(isinstance(e, fx.FailWaiters) for e in kept.effects)


def test_a_run_systemd_restarted_becomes_ready() -> None:
    lane = LaneStatus("a", mode=Mode.READY, run=1, desired=Desired.ACTIVE, started_at=90.0)
    crash = ExitFacts(1, None, requested_by_systemd=False, oom_killed=False)
    again = step(lane, i.Exited(crash, "auto-restart", 1, True), ctx())
    assert again.lane.mode is Mode.RESTARTING and again.lane.run == 2
    ready = step(again.lane, i.Ready(2, "health 200", None), ctx(101.0))
    assert ready.lane.mode is Mode.READY


def test_giving_up_keeps_the_activations_that_wait_for_the_lane_to_be_off() -> None:
    lane = LaneStatus("a", mode=Mode.READY, run=1, desired=Desired.ACTIVE)
    off = step(lane, i.TakeOff(5, "b", 11, "swap to b", False, False, False), ctx()).lane
    gave = step(off, i.GiveUp(1, "start timeout", "start-timeout"), ctx()).lane
    assert gave.op is not None and gave.op.takers == (("b", 11),)


def test_preflight_errors_refuse_and_put_back_what_was_desired() -> None:
    from laned.errors import Finding

    began = activate(
        LaneStatus("a"), evicts=("b",), desired_before={"a": Desired.INACTIVE, "b": Desired.ACTIVE}
    )
    error = Finding("lanes.a.port", "busy", "free it")
    refused = step(
        began.lane, i.Preflighted(1, (error,), 1, i.Refused("lane a: refused", "h")), ctx()
    )
    assert refused.lane.op is None and refused.lane.desired is Desired.INACTIVE
    assert fx.Post("b", i.Desire(Desired.ACTIVE)) in refused.effects
    (answer,) = [e for e in refused.effects if isinstance(e, fx.Answer)]
    assert answer.error == "PreflightFailed" and answer.findings == (error,)
    assert any(isinstance(e, fx.End) for e in refused.effects)


def test_a_newer_request_supersedes_the_one_under_way_and_its_results_go_stale() -> None:
    lane = activate(LaneStatus("a"), epoch=1).lane
    off = step(lane, i.Deactivate(2, "deactivate"), ctx())
    answers = [e for e in off.effects if isinstance(e, fx.Answer)]
    assert answers[0].epochs == (1,) and answers[0].error == "Superseded"
    assert step(off.lane, i.Preflighted(1, (), 0, None), ctx()).ignored


def test_activations_that_take_one_lane_off_together_each_hear_it_is_off() -> None:
    lane = LaneStatus("a", mode=Mode.READY, run=1, desired=Desired.ACTIVE)
    first = step(lane, i.TakeOff(5, "b", 11, "swap to b", False, False, False), ctx()).lane
    both = step(first, i.TakeOff(6, "c", 12, "swap to c", False, False, False), ctx())
    assert not any(isinstance(e, fx.Answer) for e in both.effects)  # nobody's refused
    stopping = step(both.lane, i.Ending(5, True), ctx()).lane
    for result in (i.Drained(5), i.UnitStopped(5, None), i.ContainerGone(5, None)):
        stopping = step(stopping, result, ctx()).lane
    done = step(stopping, i.WeightsDown(5, None), ctx())
    assert done.lane.mode is Mode.INACTIVE
    told = [(e.lane, e.input) for e in done.effects if isinstance(e, fx.Post)]
    assert told == [("b", i.PeerOff(11, "a")), ("c", i.PeerOff(12, "a"))]


def test_a_stop_cancels_a_waiting_restart_unfollows_and_is_no_failure() -> None:
    lane = LaneStatus("a", mode=Mode.READY, run=1, desired=Desired.ACTIVE)
    off = step(lane, i.Deactivate(5, "deactivate"), ctx())
    kinds = [type(e) for e in off.effects]
    assert fx.CancelRestart in kinds and fx.Unfollow in kinds
    stopping = step(off.lane, i.Ending(5, True), ctx()).lane
    assert stopping.mode is Mode.STOPPING and stopping.stopping
    # The engine exits on laned's stop: requested, not a failure, nothing restarted.
    asked = ExitFacts(0, None, requested_by_systemd=True, oom_killed=False, witnessed=True)
    exited = step(stopping, i.Exited(asked, "dead", 0, False), ctx())
    assert exited.lane.last_exit is not None and exited.lane.last_exit.verdict.value == "requested"
    assert not any(isinstance(e, fx.ScheduleRestart) for e in exited.effects)
    assert exited.lane.counted is None
    for result in (i.Drained(5), i.UnitStopped(5, None), i.ContainerGone(5, None)):
        stopping = step(stopping, result, ctx()).lane
    done = step(stopping, i.WeightsDown(5, None), ctx())
    assert done.lane.mode is Mode.INACTIVE and done.lane.op is None
    assert fx.Answer((5,)) in done.effects


def test_vllms_503_is_one_failure_and_its_exit_0_after_is_that_same_failure() -> None:
    lane = LaneStatus("a", mode=Mode.READY, run=1, desired=Desired.ACTIVE)
    failing = step(lane, i.Failing(1, "health 503: dead", "health", "health"), ctx(100, 7))
    assert failing.lane.mode is Mode.RESTART_STOPPING and failing.lane.counted
    assert sum(isinstance(e, fx.Count) and e.what == "failure" for e in failing.effects) == 1
    exited = step(failing.lane, i.Exited(ExitFacts(0, None, False, False), "dead", 0, False), ctx())
    assert not any(isinstance(e, fx.Count) and e.what == "failure" for e in exited.effects)
    assert exited.lane.last_exit is not None and exited.lane.last_exit.verdict.value == "failure"


def test_the_dying_line_raises_the_alarm_while_it_serves_only() -> None:
    dying = i.PhaseSeen(Seen(None, note=DYING), 50.0)
    assert fx.Alarm() in step(LaneStatus("a", mode=Mode.READY), dying, ctx()).effects
    assert not step(LaneStatus("a", mode=Mode.STARTING), dying, ctx()).effects


# --- random sequences ---------------------------------------------------------------------------

REPORTS = st.sampled_from(["ready", "exit0", "exit1", "probe", "fail", "phase", "sample"])
REQUESTS = st.sampled_from(["activate", "deactivate", "restart", "desire", "takeoff", "backoff"])
RESULTS = st.sampled_from([
    "preflighted", "peeroff", "ending-yes", "ending-no", "stale", "cleared", "refused",
    "weights-up", "drained", "stopped", "gone", "weights-down", "level", "slept", "woken",
    "cleared-wake", "slept-as",
])  # fmt: skip
MOVES = st.lists(st.one_of(REPORTS, REQUESTS, RESULTS), max_size=60)


def make(kind: str, lane: LaneStatus, n: int) -> i.Input:
    epoch = lane.op.epoch if lane.op else n
    run = lane.run
    made: dict[str, i.Input] = {
        "ready": i.Ready(run, "ok", None),
        "exit0": i.Exited(ExitFacts(0, None, False, False), "dead", 0, False),
        "exit1": i.Exited(ExitFacts(1, None, False, False), "failed", 0, False),
        "probe": i.ProbeFailed(run, 3, 3),
        "fail": i.Failing(run, "stalled", "stalled", "stalled"),
        "phase": i.PhaseSeen(Seen("loading weights"), 100.0 + n),
        "sample": i.Sampled(run, 100.0 + n, None),  # type: ignore[arg-type]
        "activate": i.Activate(1000 + n, "activate"),
        "deactivate": i.Deactivate(1000 + n, "deactivate"),
        "restart": i.Restart(1000 + n, "restart", "requested"),
        "desire": i.Desire(Desired.ACTIVE),
        "takeoff": i.TakeOff(1000 + n, "b", 7, "swap to b", False, False, False),
        "backoff": i.BackoffOver(),
        "preflighted": i.Preflighted(epoch, (), 0, None),
        "peeroff": i.PeerOff(epoch, "b"),
        "ending-yes": i.Ending(epoch, True),
        "ending-no": i.Ending(epoch, False),
        "stale": i.WeightsStale(epoch, None),
        "cleared": i.Cleared(epoch, None),
        "refused": i.Cleared(epoch, i.Refused("gpu-gate: held")),
        "cleared-wake": i.Cleared(epoch, None, waking=True),
        "slept-as": i.SleptAs(epoch, "d", None),
        "weights-up": i.WeightsUp(epoch, "", None),
        "drained": i.Drained(epoch),
        "stopped": i.UnitStopped(epoch, None),
        "gone": i.ContainerGone(epoch, None),
        "weights-down": i.WeightsDown(epoch, None),
        "level": i.LevelChosen(epoch, 1, ""),
        "slept": i.Slept(epoch, None, frozenset({9}), {0: 1}, "d"),
        "woken": i.Woken(epoch, None),
    }
    return made[kind]


@settings(max_examples=400, deadline=None)
@given(moves=MOVES)
def test_random_inputs_keep_the_machines_promises(moves: list[str]) -> None:
    lane = LaneStatus("a")
    counted_runs: dict[int, int] = {}
    answered: dict[int, int] = {}
    for n, kind in enumerate(moves):
        before = lane
        result = step(lane, make(kind, lane, n), ctx(100.0 + n, 5000 + n))
        lane = result.lane
        if result.ignored or (result.refused and before.op is None):
            assert lane is before and not result.effects
            continue
        if result.refused:  # a result only a bug brings: its request ends, its callers told
            assert isinstance(make(kind, before, n), i.Result)
            assert lane.op is None or lane.op.kind == "settle"  # a stop is finished
            assert any(isinstance(e, fx.End) for e in result.effects), result.effects
        # The public state is the mode's, always.
        assert lane.state is lane.mode.visible
        # A run's failure is counted once, whatever saw it.
        failures = sum(isinstance(e, fx.Count) and e.what == "failure" for e in result.effects)
        counted_runs[lane.run] = counted_runs.get(lane.run, 0) + failures
        assert counted_runs[lane.run] <= 1, (moves[: n + 1], counted_runs)
        # A caller is answered once.
        for effect in result.effects:
            if isinstance(effect, fx.Answer):
                for epoch in effect.epochs:
                    answered[epoch] = answered.get(epoch, 0) + 1
                    assert answered[epoch] == 1, (moves[: n + 1], epoch)
        # A new run begins only with a start (its number and clock begin again).
        if lane.run != before.run:
            assert lane.run == before.run + 1 and lane.started_at == 100.0 + n
            assert lane.mode in {Mode.STARTING, Mode.WAKING, Mode.RESTARTING}
        # An exit during laned's own stop is never counted as a failure by itself.
        if kind.startswith("exit") and before.stopping and before.counted is None:
            assert lane.counted is None or kind == "exit1"
        # Every move into ready answers its waiters.
        if lane.mode is Mode.READY and before.mode is not Mode.READY:
            assert any(isinstance(e, fx.ResolveWaiters) for e in result.effects)
        # A sequence is begun only for a request the record holds.
        if any(isinstance(e, fx.Begin) for e in result.effects):
            assert lane.op is not None


def test_start_lines_journald_stamps_after_the_engine_answered_are_still_this_starts() -> None:
    """journald stamps a stream's line when it reads it: on a busy host a fast engine's whole
    start can be stamped after it answered. Up to JOURNAL_LAG later, those lines are this
    start's (at the moment it answered at the latest); later ones, or an earlier run's, not."""
    lane = step(LaneStatus("a"), i.Adopt("asked"), ctx(100.0)).lane
    lane = step(lane, i.PhaseSeen(Seen("loading model"), 100.2), ctx(100.0)).lane
    lane = step(lane, i.Ready(lane.run, "answers", None), ctx(101.0)).lane
    assert lane.state is LaneState.READY and lane.last_starts == {"cold": 1.0}
    assert dict(lane.last_phases) == {"loading model": 0.8}
    for line, at in (
        ("loading weights", 101.0 + JOURNAL_LAG - 0.5),  # read late
        ("capturing CUDA graphs", 101.0 + JOURNAL_LAG + 0.5),  # after
        ("torch.compile", 99.0),  # before this run began
    ):
        lane = step(lane, i.PhaseSeen(Seen(line), at), ctx(140.0)).lane
    assert dict(lane.last_phases) == {"loading model": 0.8, "loading weights": 0.0}
    assert [name for name, _ in lane.phases] == ["loading model", "loading weights"]


def test_a_worker_rank_sleeps_with_its_head_from_where_it_serves_and_wakes_by_an_activation() -> (
    None
):
    """A worker's rank of a lane over several hosts, confirmed asleep on its own host
    (RankSlept), is a sleeper there: not desired, its pids and residual kept, its watcher
    ended; its head's activation then wakes it (no engine call of its own: the action's)."""
    ready = LaneStatus("a", mode=Mode.READY, desired=Desired.ACTIVE, run=2)
    slept = step(ready, i.RankSlept(1, frozenset({41, 42}), {0: 600}, "d"), ctx())
    lane = slept.lane
    assert lane.mode is Mode.SLEEPING and lane.desired is Desired.INACTIVE
    assert lane.asleep is not None and lane.asleep.pids == {41, 42} and lane.asleep.level == 1
    assert dict(lane.residual) == {0: 600} and lane.pinned
    assert any(isinstance(e, fx.Unfollow) for e in slept.effects)
    starting = step(
        LaneStatus("a", mode=Mode.STARTING), i.RankSlept(2, frozenset(), {}, "d"), ctx()
    )
    assert starting.ignored and starting.lane.mode is Mode.STARTING
    woken = activate(lane)
    assert woken.lane.desired is Desired.ACTIVE
    (seq,) = [e for e in woken.effects if isinstance(e, fx.Begin)]
    assert "CheckSlept" in [type(a).__name__ for a in seq.actions]
