"""The supervisor's decisions (laned.core.policy, laned.core.liveness), without systemd or asyncio."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from laned import engines
from laned.config.applied import Applied, applied_of
from laned.config.groups import groups, port_sharers
from laned.config.model import DaemonConfig, LaneConfig
from laned.core import exits, policy, resume
from laned.core.exits import ExitFacts, ExitRecord
from laned.core.lanes import Desired, LaneState, Verdict
from laned.core.liveness import EngineSample, MemoryFloor, tokens_per_second
from laned.core.policy import Admit, Current, ExitAction, OpKind, UnitChange
from laned.core.unit_state import CLD_EXITED, CLD_KILLED, UnitSnapshot
from laned.validation.load import Config, parse_config


def config(extra: str = "", default_lane: str = "") -> Config:
    daemon = f'[daemon]\ndefault_lane = "{default_lane}"\n' if default_lane else ""
    text = daemon
    for name, port in (("a", 8001), ("b", 8001), ("c", 8003)):
        group = 'group = "other"\n' if name == "c" else 'group = "gpu"\n'
        text += (
            f'[lanes.{name}]\nport = {port}\nserved_model_name = "{name}"\n{group}{extra}'
            f'[lanes.{name}.exec]\ncommand = ["/bin/engine"]\n'
        )
    return parse_config(text, "t.toml", {"HOME": "/home/op"})


CONFIG = config('restart_sec = "1s"\nrestart_max_delay = "8s"\nstart_limit_burst = 3\n')
SPEC = CONFIG.lanes["a"]
ALL_STATES = list(LaneState)


# --- groups, ports, "already active" --------------------------------------------------------


def test_lanes_of_a_group_and_on_one_port_are_named_by_the_group_module() -> None:
    assert groups(CONFIG) == ["gpu", "other"]
    assert port_sharers(CONFIG, "a") == ["b"] and port_sharers(CONFIG, "c") == []


@pytest.mark.parametrize("state", ALL_STATES)
def test_already_active_means_desired_and_holding(state: LaneState) -> None:
    assert policy.already_active(state, Desired.ACTIVE) is (state in policy.HOLDING_STATES)
    assert policy.already_active(state, Desired.INACTIVE) is False


def test_the_port_peer_is_the_group_lane_that_holds_the_port() -> None:
    idle = dict.fromkeys(CONFIG.lanes, LaneState.INACTIVE)
    assert policy.port_peer(CONFIG, "a", idle) is None
    assert policy.port_peer(CONFIG, "a", {**idle, "b": LaneState.READY}) == "b"
    assert policy.port_peer(CONFIG, "a", {**idle, "b": LaneState.RESTARTING}) == "b"
    assert policy.port_peer(CONFIG, "a", {**idle, "a": LaneState.STARTING}) == "a"
    assert policy.port_peer(CONFIG, "a", {**idle, "b": LaneState.FAILED}) is None


# --- admitting requests ---------------------------------------------------------------------


def test_an_activation_joins_its_twin_waits_when_running_and_else_replaces() -> None:
    twin = Current("a", OpKind.ACTIVATE)
    assert policy.admit_activate("a", twin, LaneState.INACTIVE, Desired.ACTIVE) is Admit.JOIN
    assert policy.admit_activate("a", None, LaneState.READY, Desired.ACTIVE) is Admit.WAIT_READY
    assert (
        policy.admit_activate("a", None, LaneState.RESTARTING, Desired.ACTIVE) is Admit.WAIT_READY
    )
    for current in (None, Current("b", OpKind.ACTIVATE), Current("a", OpKind.DEACTIVATE)):
        assert policy.admit_activate("a", current, LaneState.INACTIVE, Desired.INACTIVE) is (
            Admit.REPLACE
        )
    # A restart of a peer (the lane is not desired): the activation wins.
    peer = Current("b", OpKind.RESTART)
    assert policy.admit_activate("a", peer, LaneState.INACTIVE, Desired.INACTIVE) is Admit.REPLACE


# --- unit changes ---------------------------------------------------------------------------

RUNNING = UnitSnapshot("a.service", "active", "running")
DEAD = UnitSnapshot("a.service", "inactive", "dead")
FAILED = UnitSnapshot("a.service", "failed", "failed", "exit-code", CLD_EXITED, 75)
AUTO = UnitSnapshot("a.service", "activating", "auto-restart", "exit-code")
STOPPING = UnitSnapshot("a.service", "deactivating", "stop-sigterm")


def test_an_exit_is_the_main_process_going_from_a_unit_that_ran() -> None:
    for after in (DEAD, FAILED, AUTO):
        for before in (RUNNING, STOPPING):
            assert policy.judge_unit_change(before, after, LaneState.READY, False) is (
                UnitChange.EXITED
            )
    assert policy.judge_unit_change(DEAD, FAILED, LaneState.READY, False) is UnitChange.NOTHING
    # An inactive unit that "exits" again (a reset-failed, a reload) is no exit.
    assert policy.judge_unit_change(DEAD, DEAD, LaneState.READY, False) is UnitChange.NOTHING


@pytest.mark.parametrize("state", ALL_STATES)
def test_a_start_behind_laneds_back_is_seen_only_when_laned_starts_nothing(
    state: LaneState,
) -> None:
    seen = policy.judge_unit_change(DEAD, RUNNING, state, starting_by_laned=False)
    expected = UnitChange.STARTED_OUTSIDE if state in policy.SETTLED_STATES else UnitChange.NOTHING
    assert seen is expected
    assert policy.judge_unit_change(DEAD, RUNNING, state, True) is UnitChange.NOTHING


# --- exits ------------------------------------------------------------------------------------


def test_the_wrappers_record_of_this_run_wins_over_systemds_view() -> None:
    record = ExitRecord(status=137, requested=False, at=100.0, oom_killed=True)
    facts = exits.exit_facts(record, started_at=99.0, snap=FAILED)
    assert facts == ExitFacts(None, 9, False, True, witnessed=True)
    assert "signal 9" in facts.describe() and "OOM" in facts.describe()
    # A record older than this run (by more than 2 s of clock skew) is an earlier run's.
    stale = exits.exit_facts(record, started_at=200.0, snap=FAILED)
    assert stale == ExitFacts(75, None, False, False)
    killed = UnitSnapshot("a.service", "failed", "failed", "signal", CLD_KILLED, 9)
    assert exits.exit_facts(None, 0, killed) == ExitFacts(None, 9, False, False)
    clean = UnitSnapshot("a.service", "inactive", "dead", "success", CLD_EXITED, 0)
    assert exits.exit_facts(None, 0, clean).requested_by_systemd is True
    # Killed at TimeoutStopSec: no OOM guess, the timeout is named.
    late = UnitSnapshot("a.service", "failed", "failed", "timeout", CLD_KILLED, 9)
    said = exits.exit_facts(None, 0, late).describe()
    assert "stop_timeout" in said and "OOM" not in said, said


def test_parse_exit_record() -> None:
    assert exits.parse_exit_record("status=0 requested=1 at=12.5 oom=0\n") == ExitRecord(
        0, True, 12.5, False
    )
    assert exits.parse_exit_record("status=0 requested=0 late=1 at=12 oom=0\n") == ExitRecord(
        0, False, 12.0, False, late=True
    )
    assert exits.parse_exit_record("status=x requested=1 at=1") is None
    assert exits.parse_exit_record("") is None


def plan(
    facts: ExitFacts,
    *,
    laned: bool = False,
    state: LaneState = LaneState.READY,
    desired: Desired = Desired.ACTIVE,
    failures: tuple[float, ...] = (),
    now: float = 1000.0,
    systemd_restarts: bool = False,
    sub_state: str = "failed",
    counted: str | None = None,
    ready_at: float = 0.0,
) -> policy.ExitPlan:
    return policy.plan_exit(
        SPEC,
        facts,
        stopping_by_laned=laned,
        state=state,
        desired=desired,
        failures=failures,
        now=now,
        systemd_restarts=systemd_restarts,
        sub_state=sub_state,
        counted=counted,
        ready_at=ready_at,
    )


STATUS_0 = ExitFacts(0, None, False, False)
STOPPED = ExitFacts(0, None, True, False)


def test_a_stop_somebody_asked_for_is_requested_and_nothing_else_is() -> None:
    own = plan(STATUS_0, laned=True)
    assert (own.verdict, own.action) == (Verdict.REQUESTED, ExitAction.OWN_STOP)
    outside = plan(STOPPED)
    assert (outside.verdict, outside.action) == (Verdict.REQUESTED, ExitAction.STOPPED_OUTSIDE)
    # systemd stopped it, while laned was stopping or restarting it: laned's own.
    for state in (LaneState.STOPPING, LaneState.RESTARTING):
        assert plan(STOPPED, state=state).action is ExitAction.OWN_STOP
    # Status 0 that nobody asked for is vLLM's API server dying with its engine.
    dead = plan(STATUS_0)
    assert dead.verdict is Verdict.FAILURE and dead.action is ExitAction.RESTART_LATER
    assert "status 0" in dead.reason and dead.failures == (1000.0,)


# The wrapper saw the engine exit 0 on its own; laned's stop (a restart after failed probes)
# reached the wrapper only during its clean-up.
OWN_EXIT_THEN_STOP = ExitFacts(0, None, False, False, witnessed=True, late_stop=True)
STOP_THEN_EXIT = ExitFacts(0, None, True, False, witnessed=True)


def test_an_exit_before_laneds_stop_is_the_engines_own_failure_and_counted() -> None:
    got = plan(OWN_EXIT_THEN_STOP, laned=True, state=LaneState.RESTARTING, failures=(990.0,))
    # The operation that stops the lane goes on; the failure is counted once, here.
    assert (got.verdict, got.action) == (Verdict.FAILURE, ExitAction.OWN_STOP)
    assert got.failures == (990.0, 1000.0)
    assert "before laned's stop reached it" in got.reason and "only after it" in got.reason
    assert plan(STOP_THEN_EXIT, laned=True).verdict is Verdict.REQUESTED


@pytest.mark.parametrize("facts", [STATUS_0, STOPPED, OWN_EXIT_THEN_STOP, STOP_THEN_EXIT])
def test_a_run_whose_failure_was_counted_fails_once(facts: ExitFacts) -> None:
    # Health probes (or a stall, a start timeout) counted the run's failure and laned stopped
    # it: its exit, however it looks, is that failure's end, never requested nor counted again.
    got = plan(facts, laned=True, failures=(995.0,), counted="health: 3 consecutive probe failures")
    assert (got.verdict, got.action, got.failures) == (
        Verdict.FAILURE,
        ExitAction.OWN_STOP,
        (995.0,),
    )
    assert "seen first as health: 3 consecutive probe failures (counted once)" in got.reason
    # laned's stop is no longer under way (its operation broke on a lost bus): the exit is
    # handled as a failure, still not counted again.
    alone = plan(facts, failures=(995.0,), counted="health: 3 consecutive probe failures")
    assert (alone.verdict, alone.action, alone.failures) == (
        Verdict.FAILURE,
        ExitAction.RESTART_LATER,
        (995.0,),
    )


def test_failures_counted_by_other_paths_make_a_crash_loop() -> None:
    window: tuple[float, ...] = ()
    for n in range(1, SPEC.start_limit_burst + 1):
        counted = policy.count_failure(SPEC, window, 1000.0 + n, "health: 3 failures")
        window = counted.failures
        assert len(window) == n and counted.crash_loop is (n == SPEC.start_limit_burst)
    assert counted.reason == "crash-loop: 3 failures within 1800s; last health: 3 failures"


def test_good_runs_reset_the_backoff_but_not_the_crash_loop_window() -> None:
    # Two failures, then a run that became ready at 998: the third failure is the first in a
    # row (restart_sec), and the third within start_limit_interval (burst 3: crash loop).
    after_good = plan(STATUS_0, failures=(990.0,), ready_at=998.0)
    assert after_good.action is ExitAction.RESTART_LATER and after_good.delay == SPEC.restart_sec
    in_a_row = plan(STATUS_0, failures=(990.0,))
    assert in_a_row.delay == 2 * SPEC.restart_sec
    loop = plan(STATUS_0, failures=(990.0, 995.0), ready_at=998.0)
    assert loop.action is ExitAction.CRASH_LOOP


def test_a_failure_of_a_lane_nobody_wants_is_failed_not_restarted() -> None:
    assert plan(STATUS_0, desired=Desired.INACTIVE).action is ExitAction.FAIL


def test_systemds_own_restart_is_followed_where_systemd_restarts() -> None:
    auto = plan(STATUS_0, systemd_restarts=True, sub_state="auto-restart")
    assert auto.action is ExitAction.SYSTEMD_RESTARTS and "systemd restarts it" in auto.reason
    assert plan(STATUS_0, sub_state="auto-restart").action is ExitAction.RESTART_LATER


def test_the_burst_ends_in_a_crash_loop_and_old_failures_are_forgotten() -> None:
    loop = plan(STATUS_0, failures=(990.0, 995.0))
    assert loop.action is ExitAction.CRASH_LOOP and loop.reason.startswith("crash-loop: 3")
    window = SPEC.start_limit_interval
    old = plan(STATUS_0, failures=(1.0, 2.0), now=window + 10)  # outside start_limit_interval
    assert old.action is ExitAction.RESTART_LATER and old.failures == (window + 10,)


@given(
    failures=st.lists(st.floats(0, 1000, allow_nan=False), max_size=6),
    code=st.integers(0, 255),
    laned=st.booleans(),
    systemd=st.booleans(),
    witnessed=st.booleans(),
    state=st.sampled_from(ALL_STATES),
    desired=st.sampled_from(list(Desired)),
)
def test_exit_plans_hold_their_invariants(
    failures: list[float],
    code: int,
    laned: bool,
    systemd: bool,
    witnessed: bool,
    state: LaneState,
    desired: Desired,
) -> None:
    facts = ExitFacts(code, None, systemd, False, witnessed=witnessed)
    got = plan(facts, laned=laned, state=state, desired=desired, failures=tuple(failures))
    assert (got.verdict is Verdict.REQUESTED) is (systemd or (laned and not witnessed))
    if laned:
        assert got.action is ExitAction.OWN_STOP  # laned's operation makes the transition
    if got.verdict is Verdict.FAILURE:
        assert got.failures[-1] == 1000.0
        assert all(1000.0 - t <= SPEC.start_limit_interval for t in got.failures)
    if got.action is ExitAction.RESTART_LATER:
        assert SPEC.restart_sec <= got.delay <= SPEC.restart_max_delay
        assert desired is Desired.ACTIVE and len(got.failures) < SPEC.start_limit_burst
    if got.action is ExitAction.CRASH_LOOP:
        assert len(got.failures) >= SPEC.start_limit_burst


@given(st.integers(1, 40), st.floats(0.1, 30), st.floats(1, 600))
def test_backoff_grows_and_never_passes_the_cap(n: int, base: float, cap: float) -> None:
    delay = policy.backoff_delay(base, n, cap)
    assert delay <= cap
    assert delay <= policy.backoff_delay(base, n + 1, cap)


# --- reload, reconcile -----------------------------------------------------------------------


def test_a_reload_may_not_remove_or_rename_a_lane_that_runs_or_is_under_way() -> None:
    idle = dict.fromkeys(CONFIG.lanes, LaneState.INACTIVE)
    smaller = config().model_copy(
        update={"lanes": {k: v for k, v in config().lanes.items() if k != "b"}}
    )
    assert policy.reload_problems(CONFIG, smaller, idle) == []
    running = {**idle, "b": LaneState.READY}
    assert policy.reload_problems(CONFIG, smaller, running) == [
        "lanes.b is ready: deactivate it before removing it"
    ]
    assert policy.reload_problems(CONFIG, smaller, idle, under_way=["b"]) == [
        "lanes.b is inactive: deactivate it before removing it"
    ]
    moved = CONFIG.model_copy(
        update={"daemon": CONFIG.daemon.model_copy(update={"listen": "127.0.0.1:9999"})}
    )
    assert policy.reload_problems(CONFIG, moved, idle) == [
        "daemon.listen changed: only a restart of laned applies it (systemctl --user restart laned)"
    ]


def test_a_running_lane_whose_config_changed_needs_a_restart() -> None:
    new = config('restart_sec = "2s"\nrestart_max_delay = "8s"\nstart_limit_burst = 3\n')
    states = {"a": LaneState.READY, "b": LaneState.INACTIVE, "c": LaneState.RESTARTING}
    assert policy.restart_needed(CONFIG, new, states) == ["a", "c"]
    assert policy.restart_needed(CONFIG, CONFIG, states) == []


def test_every_daemon_and_lane_setting_declares_how_a_reload_applies_it() -> None:
    for model in (DaemonConfig, LaneConfig):
        for key in model.model_fields:
            assert isinstance(applied_of(model, key), Applied), f"{model.__name__}.{key}"
    # What the issue named: the guard's and the peers' settings live, the listener and the
    # folders only at a restart of laned, an engine's port at its next start.
    assert applied_of(DaemonConfig, "token_for_reads") is Applied.LIVE
    assert applied_of(DaemonConfig, "podman_socket") is Applied.LIVE
    assert applied_of(DaemonConfig, "unit_dir") is Applied.RESTART
    assert applied_of(LaneConfig, "port") is Applied.NEXT_START
    # Issue 53: systemd applies TimeoutStopSec= to a running unit at the reload's
    # daemon-reload (tests/reliability/test_reload_keys.py reads it back): live, not deferred.
    assert applied_of(LaneConfig, "stop_timeout") is Applied.LIVE
    stopping = config('restart_sec = "1s"\nrestart_max_delay = "8s"\nstart_limit_burst = 3\nstop_timeout = "9s"\n')  # fmt: skip
    assert policy.restart_needed(CONFIG, stopping, {"a": LaneState.READY}) == []


def test_a_reload_sorts_each_changed_key_by_its_declaration() -> None:
    new = config('restart_sec = "2s"\npriority = 3\n')
    changes = {c.key: c.applied for c in policy.reload_changes(CONFIG, new)}
    assert changes == {
        **{f"lanes.{lane}.restart_sec": Applied.NEXT_START for lane in "abc"},
        **{f"lanes.{lane}.restart_max_delay": Applied.NEXT_START for lane in "abc"},
        **{f"lanes.{lane}.start_limit_burst": Applied.NEXT_START for lane in "abc"},
        **{f"lanes.{lane}.priority": Applied.LIVE for lane in "abc"},
    }
    live_only = config('restart_sec = "1s"\nrestart_max_delay = "8s"\nstart_limit_burst = 3\npriority = 3\n')  # fmt: skip
    states = {"a": LaneState.READY, "b": LaneState.INACTIVE, "c": LaneState.SLEEPING}
    assert policy.restart_needed(CONFIG, live_only, states) == []  # priority is read live
    moved = CONFIG.model_copy(update={"daemon": CONFIG.daemon.model_copy(update={"unit_dir": "/elsewhere", "token_for_reads": True})})  # fmt: skip
    assert policy.reload_problems(
        CONFIG, moved, dict.fromkeys(CONFIG.lanes, LaneState.INACTIVE)
    ) == [
        "daemon.unit_dir changed: only a restart of laned applies it (systemctl --user restart laned)"
    ]


def test_reconcile_adopts_what_runs_and_starts_what_is_desired() -> None:
    idle = dict.fromkeys(CONFIG.lanes, LaneState.INACTIVE)
    desired = {"a": Desired.ACTIVE, "b": Desired.INACTIVE, "c": Desired.ACTIVE}
    got = resume.plan_reconcile(CONFIG, ["c"], desired, idle, first=False, workers=())
    assert got.adopt == ("c",) and got.start == (("a", "restore the desired lane"),)
    failed = resume.plan_reconcile(
        CONFIG, [], desired, {**idle, "a": LaneState.FAILED}, False, workers=()
    )
    assert failed.start == (("c", "restore the desired lane"),)
    first = config(default_lane="b")
    fresh = resume.plan_reconcile(first, [], {}, idle, first=True, workers=())
    assert fresh.start == (("b", "default lane"),)
    assert resume.plan_reconcile(first, ["a"], {}, idle, first=True, workers=()).start == ()


CU = resume.CatchUp
ON, OFF = Desired.ACTIVE, Desired.INACTIVE


@pytest.mark.parametrize(
    ("state", "desired", "running", "busy", "want"),
    [
        # An operation, a pending restart or a watch under way finishes by itself.
        (LaneState.RESTARTING, ON, True, True, CU.NOTHING),
        (LaneState.READY, ON, False, True, CU.NOTHING),
        # A restart the lost bus broke, its unit still running: follow the engine again.
        (LaneState.RESTARTING, ON, True, False, CU.ADOPT),
        (LaneState.STARTING, ON, True, False, CU.ADOPT),
        # Its own run gone (it held the GPUs): start it again.
        (LaneState.RESTARTING, ON, False, False, CU.RESTART),
        (LaneState.READY, ON, False, False, CU.RESTART),
        # A swap that never started it: activate it (its peers stop first).
        (LaneState.INACTIVE, ON, False, False, CU.ACTIVATE),
        # A failed lane stays failed until activated.
        (LaneState.FAILED, ON, False, False, CU.NOTHING),
        # A stop the lost bus broke: stop it; one that happened: say so.
        (LaneState.STOPPING, OFF, True, False, CU.STOP),
        (LaneState.STOPPING, OFF, False, False, CU.SETTLE),
        (LaneState.INACTIVE, OFF, False, False, CU.NOTHING),
        (LaneState.FAILED, OFF, False, False, CU.NOTHING),
    ],
)
def test_catch_up_one_lane_after_the_bus_or_the_manager_came_back(
    state: LaneState, desired: Desired, running: bool, busy: bool, want: resume.CatchUp
) -> None:
    now = resume.LaneNow(state, desired, running, busy)
    assert resume.plan_catch_up(CONFIG, {"c": now}, workers=()) == {"c": want}


def test_catch_up_a_broken_swap_activates_the_lane_and_leaves_its_peers_to_it() -> None:
    # a -> b broke at a's stop: a runs and is not desired, b is desired and never started.
    lanes = {
        "a": resume.LaneNow(LaneState.STOPPING, OFF, True, False),
        "b": resume.LaneNow(LaneState.INACTIVE, ON, False, False),
        "c": resume.LaneNow(LaneState.READY, OFF, True, False),  # another group: stopped
    }
    assert resume.plan_catch_up(CONFIG, lanes, workers=()) == {
        "a": CU.NOTHING,
        "b": CU.ACTIVATE,
        "c": CU.STOP,
    }


def test_catch_up_leaves_a_worker_rank_to_its_head() -> None:
    ranks = config('args = ["--headless"]\n')  # vLLM's worker switch
    assert engines.workers(ranks.lanes) == {"a", "b", "c"}
    lanes = {"a": resume.LaneNow(LaneState.INACTIVE, ON, False, False)}
    assert resume.plan_catch_up(ranks, lanes, workers={"a"}) == {"a": CU.NOTHING}
    desired = {"a": Desired.ACTIVE}
    idle = {"a": LaneState.INACTIVE}
    assert resume.plan_reconcile(ranks, [], desired, idle, True, workers={"a"}).start == ()


def test_a_run_lost_with_its_user_manager_is_a_failure_with_no_status() -> None:
    lost = exits.LOST_WITH_MANAGER
    plan = policy.plan_exit(
        SPEC, lost, stopping_by_laned=False, state=LaneState.READY, desired=Desired.ACTIVE,
        failures=[], now=100.0, systemd_restarts=False, sub_state="dead",
    )  # fmt: skip
    assert plan.verdict is Verdict.FAILURE and plan.action is ExitAction.RESTART_LATER
    assert "the user manager that ran it went away" in plan.reason
    assert "status None" not in plan.reason


# --- liveness -------------------------------------------------------------------------------


def test_the_memory_floor_needs_low_memory_for_the_whole_time() -> None:
    floor = MemoryFloor(floor_gib=4, for_seconds=10)
    assert not floor.observe(2.0, 0.0)
    assert not floor.observe(2.0, 9.0)
    assert not floor.observe(8.0, 9.5)  # recovered: the clock starts again
    assert not floor.observe(2.0, 10.0)
    assert floor.observe(2.0, 20.0)
    assert not MemoryFloor(0, 10).observe(0.1, 100.0)  # disabled
    assert not floor.observe(None, 30.0)  # unreadable: no verdict


def test_tokens_per_second_over_a_window() -> None:
    def sample(tokens: float) -> EngineSample:
        return EngineSample(1, 0, tokens, 0)

    assert tokens_per_second([]) == 0.0
    assert tokens_per_second([(0.0, sample(0)), (2.0, sample(100))]) == 50.0
    assert tokens_per_second([(0.0, sample(100)), (2.0, sample(0))]) == 0.0  # a restart


@pytest.mark.parametrize(
    ("code", "signal", "words"),
    [
        (127, None, "command not found: /opt/venv/bin/vllm"),
        (126, None, "not executable: /opt/venv/bin/vllm"),
        (137, None, "SIGKILL: killed, often by the kernel's OOM killer"),
        (None, 9, "SIGKILL"),
        (139, None, "SIGSEGV: the engine crashed"),
        (75, None, "laned's wrapper: the engine exited with status 0 on its own"),
    ],
)
def test_exit_statuses_are_explained_where_they_are_shown(
    code: int | None, signal: int | None, words: str
) -> None:
    assert words in exits.explain_exit(code, signal, "/opt/venv/bin/vllm")
    shown = ExitFacts(code, signal, False, False).describe("/opt/venv/bin/vllm")
    assert words in shown and shown.startswith("signal" if signal else "status")


def test_plain_statuses_get_no_invented_meaning() -> None:
    assert exits.explain_exit(0, None) == "" and exits.explain_exit(1, None) == ""
    assert ExitFacts(0, None, False, False).describe() == "status 0"
