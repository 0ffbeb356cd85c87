"""The scheduling policy of requests for several lanes of a group (laned.core.schedule),
without I/O: single decisions, and a whole group replayed over arrival orders that
hypothesis draws (every request served, none waits past its bound, no lane starves)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laned.config.groups import default_lane, default_lanes, idle_return
from laned.core.schedule import (
    IDLE_GRACE,
    PRIORITY_STEP,
    UNMEASURED_RESIDENCY,
    Decision,
    LaneView,
    Verdict,
    admit,
    decide,
    min_residency,
)
from laned.errors import ConfigError
from laned.validation.load import parse_config

A = LaneView("a", serving=True, resident=True, ready_since=0.0, min_residency=100.0)
B = LaneView("b")


def test_a_busy_resident_keeps_the_gpus_until_it_has_paid_for_its_swap() -> None:
    busy = replace(A, in_flight=2)
    waiting = replace(B, arrivals=(10.0, 11.0, 12.0))
    # 50 s in, a request in flight: b waits; decided again when a's residency ends.
    assert decide([busy, waiting], 50.0) == Decision(again_at=100.0)
    swap = decide([busy, waiting], 100.0)
    assert swap.swap_to == "b" and swap.cause == "residency"
    assert swap.reason == (
        "swap to b: 3 request(s) waiting 90 s; a resident 100 s, past its min residency 100 s"
    )


def test_an_idle_resident_gives_way_after_its_grace_and_not_before() -> None:
    quiet = replace(A, quiet_since=40.0)
    waiting = replace(B, arrivals=(45.0,))
    grace = 100.0 * IDLE_GRACE
    assert decide([quiet, waiting], 40.0 + grace - 1).again_at == 40.0 + grace
    swap = decide([quiet, waiting], 40.0 + grace)
    assert (swap.swap_to, swap.cause) == ("b", "idle")
    assert "a idle 10 s" in swap.reason


def test_many_requests_that_arrive_together_make_one_swap() -> None:
    waiting = replace(B, arrivals=tuple(float(t) for t in range(20)))
    first = decide([replace(A, quiet_since=0.0), waiting], 30.0)
    assert first.swap_to == "b"
    # The swap is under way: b is desired (resident) but not serving; nothing more is asked.
    moving = [replace(A, resident=False), replace(waiting, resident=True)]
    assert decide(moving, 31.0) == Decision()


def test_the_longest_waiting_lane_goes_next_and_priority_weighs_minutes() -> None:
    c = LaneView("c")
    early_b, late_c = replace(B, arrivals=(10.0,)), replace(c, arrivals=(20.0,))
    assert decide([replace(A, quiet_since=0.0), early_b, late_c], 60.0).swap_to == "b"
    urgent_c = replace(late_c, priority=1)  # 10 s less waiting, worth 60 s more
    assert decide([replace(A, quiet_since=0.0), early_b, urgent_c], 60.0).swap_to == "c"
    assert PRIORITY_STEP == 60.0


def test_a_pinned_resident_stays_and_requests_for_its_peers_are_refused() -> None:
    pinned = replace(A, pinned=True, quiet_since=0.0)
    assert decide([pinned, replace(B, arrivals=(1.0,))], 1000.0) == Decision()
    refused = admit(B, [pinned], "laned", 5.0)
    assert refused.verdict is Verdict.REFUSE and "a is pinned" in refused.why


def test_admission_goes_waits_or_refuses() -> None:
    assert admit(A, [B], "laned", 5.0).verdict is Verdict.GO
    assert admit(B, [A], "laned", 5.0).verdict is Verdict.WAIT  # on demand: its turn comes
    starting = replace(B, resident=True)
    assert admit(starting, [A], "laned", 5.0).verdict is Verdict.WAIT
    off = replace(B, blocked="on_demand is off for it")
    assert admit(off, [A], "laned", 5.0) == admit(off, [A], "fifo", 5.0)
    assert admit(off, [A], "laned", 5.0).why == "on_demand is off for it"
    # fifo: the resident's new request queues behind an older one for another lane.
    older_b = replace(B, arrivals=(3.0,))
    assert admit(A, [older_b], "fifo", 5.0).verdict is Verdict.WAIT
    assert admit(A, [older_b], "fifo", 2.0).verdict is Verdict.GO
    assert admit(A, [older_b], "laned", 5.0).verdict is Verdict.GO


def test_fifo_swaps_to_the_head_as_soon_as_the_resident_has_nothing_in_flight() -> None:
    b_first = replace(B, arrivals=(1.0,))
    a_queued = replace(A, arrivals=(2.0,), in_flight=1)
    assert decide([a_queued, b_first], 5.0, "fifo") == Decision()
    swap = decide([replace(a_queued, in_flight=0), b_first], 5.0, "fifo")
    assert (swap.swap_to, swap.cause) == ("b", "fifo")
    a_first = replace(a_queued, arrivals=(0.5,), in_flight=0)
    assert decide([a_first, b_first], 5.0, "fifo") == Decision()  # the head is a's own


def test_the_group_returns_to_its_default_lane_after_idle_return() -> None:
    b_resident = replace(B, serving=True, resident=True, ready_since=0.0, quiet_since=100.0)
    a_home = LaneView("a")
    lanes = [a_home, b_resident]
    assert decide(lanes, 200.0, default_lane="a", idle_return=1800.0, last_request=150.0) == Decision(again_at=1950.0)  # fmt: skip
    back = decide(lanes, 1950.0, default_lane="a", idle_return=1800.0, last_request=150.0)
    assert (back.swap_to, back.cause) == ("a", "idle_return")
    assert "no request for 1800 s" in back.reason
    assert decide(lanes, 9999.0, default_lane="a") == Decision()  # no idle_return: stays
    busy = replace(b_resident, quiet_since=None, in_flight=1)
    assert decide([a_home, busy], 9999.0, default_lane="a", idle_return=1.0) == Decision()
    pinned = replace(b_resident, pinned=True)
    assert decide([a_home, pinned], 9999.0, default_lane="a", idle_return=1.0) == Decision()


def test_min_residency_is_the_measured_swap_in_unless_the_lane_says() -> None:
    assert min_residency(None, False, 2.0, 130.0) == (130.0, "its measured cold start")
    assert min_residency(None, True, 2.0, 130.0) == (2.0, "its measured wake")
    assert min_residency(300.0, True, 2.0, 130.0) == (300.0, "its min_residency")
    assert min_residency(None, False, None, None) == (UNMEASURED_RESIDENCY, "not measured yet")


GROUPS = """
[daemon]
default_lane = "a"
idle_return = "30m"
[lanes.a]
port = 8001
served_model_name = "a"
[lanes.a.exec]
command = ["/bin/engine"]
[lanes.b]
port = 8002
served_model_name = "b"
on_demand = true
pinned = true
priority = 2
min_residency = "5m"
[lanes.b.exec]
command = ["/bin/engine"]
[lanes.c]
port = 8003
group = "other"
served_model_name = "c"
[lanes.c.exec]
command = ["/bin/engine"]
"""


def test_groups_say_their_default_lane_and_idle_return_and_bad_ones_are_named() -> None:
    config = parse_config(GROUPS, "t.toml", {"HOME": "/home/op"})
    assert default_lanes(config) == [("a", 1800.0)]  # daemon.default_lane, of no group
    assert default_lane(config, "other") is None and idle_return(config, "other") == 1800.0
    spec = config.lanes["b"]
    assert spec.pinned and spec.priority == 2 and spec.min_residency == 300.0
    bad = GROUPS + '[groups.othr]\ndefault_lane = "c"\n[groups.other]\ndefault_lane = "a"\nidle_return = "1h"\n'  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        parse_config(bad, "t.toml", {"HOME": "/home/op"})
    text = str(refused.value)
    assert "groups.othr: no lane is of group 'othr'" in text and "did you mean 'other'?" in text
    assert "groups.other.default_lane: lane 'a' is of no group, not 'other'" in text


# --- a whole group, replayed ------------------------------------------------------------------


@dataclass
class Group:
    """A group replayed in steps of DT seconds: requests take `service` seconds once
    admitted (an engine batches them), a swap drains the resident's requests and then costs
    the next lane's `cost` seconds."""

    costs: dict[str, float]
    service: float
    policy: str = "laned"
    resident: str | None = None
    serving: bool = False
    ready_since: float = 0.0
    swap_done: float = 0.0
    flying: dict[str, list[float]] = field(default_factory=dict)  # end times
    queued: dict[str, list[float]] = field(default_factory=dict)  # arrival times
    quiet: dict[str, float] = field(default_factory=dict)
    waits: list[float] = field(default_factory=list)
    swaps: int = 0

    def view(self, lane: str) -> LaneView:
        busy = self.flying.get(lane) or self.queued.get(lane)
        here = lane == self.resident
        return LaneView(
            lane,
            serving=here and self.serving,
            resident=here,
            min_residency=self.costs[lane],
            ready_since=self.ready_since if here and self.serving else None,
            quiet_since=None if busy else max(self.quiet.get(lane, 0.0), self.ready_since),
            in_flight=len(self.flying.get(lane, ())),
            arrivals=tuple(self.queued.get(lane, ())),
        )

    def step(self, now: float, arriving: list[str]) -> None:
        for lane, ends in self.flying.items():
            if ends and max(ends) <= now:
                self.quiet[lane] = now
            ends[:] = [e for e in ends if e > now]
        if self.resident and not self.serving and now >= self.swap_done:
            drained = not any(self.flying.get(n) for n in self.costs if n != self.resident)
            if drained:
                self.serving, self.ready_since = True, now
        for lane in arriving:
            self.queued.setdefault(lane, []).append(now)
        views = {n: self.view(n) for n in self.costs}
        for lane, waiting in self.queued.items():
            peers = [v for n, v in views.items() if n != lane]
            for arrived in list(waiting):
                if admit(views[lane], peers, self.policy, arrived).verdict is Verdict.GO:
                    waiting.remove(arrived)
                    self.waits.append(now - arrived)
                    self.flying.setdefault(lane, []).append(now + self.service)
        decision = decide([self.view(n) for n in self.costs], now, self.policy)
        if decision.swap_to is not None:
            last_end = max((e for n, ends in self.flying.items() for e in ends), default=now)
            self.resident, self.serving, self.swaps = decision.swap_to, False, self.swaps + 1
            self.swap_done = max(now, last_end) + self.costs[decision.swap_to]

    def waiting(self) -> int:
        return sum(len(q) for q in self.queued.values())


DT = 0.5
arrival = st.tuples(st.integers(0, 400), st.sampled_from(["a", "b", "c"]))


@settings(max_examples=60, deadline=None)
@given(
    arrivals=st.lists(arrival, min_size=1, max_size=60),
    costs=st.tuples(*[st.sampled_from([2.0, 5.0, 20.0])] * 3),
    service=st.sampled_from([0.5, 3.0, 10.0]),
)
def test_every_request_is_served_within_its_bound_and_no_lane_starves(
    arrivals: list[tuple[int, str]], costs: tuple[float, float, float], service: float
) -> None:
    group = Group(dict(zip("abc", costs, strict=True)), service)
    by_step: dict[int, list[str]] = {}
    for at, lane in arrivals:
        by_step.setdefault(at, []).append(lane)
    step = 0
    while step <= 400 or group.waiting():
        group.step(step * DT, by_step.get(step, []))
        step += 1
        assert step < 10_000, "requests still wait long after the last arrival: starvation"
    assert len(group.waits) == len(arrivals)
    # A request waits at most for every lane's turn once: its drain, swap and residency.
    longest = max(costs)
    bound = 3 * (service + 2 * longest) + longest + 4 * DT
    assert max(group.waits) <= bound, (max(group.waits), bound)


def test_two_agents_alternating_two_models_swap_less_under_laneds_policy_than_fifo() -> None:
    swaps = {}
    for policy in ("laned", "fifo"):
        group = Group({"a": 20.0, "b": 20.0, "c": 20.0}, 2.0, policy)
        # Two agents, each alternating a and b with 3 s of thought between turns.
        plan: dict[int, list[str]] = {}
        for agent, offset in ((0, 0), (1, 3)):
            t = offset
            for turn in range(12):
                plan.setdefault(t, []).append("ab"[(turn + agent) % 2])
                t += 10  # 2 s answered + 3 s thought, in DT steps
        step = 0
        while step <= max(plan) or group.waiting():
            group.step(step * DT, plan.get(step, []))
            step += 1
        swaps[policy] = group.swaps
    assert swaps["laned"] < swaps["fifo"], swaps


def _ready(records: Any, lane: str, now: float) -> None:
    """The lane started and ready at `now`, through the lane machine's step (as the owner's
    interpreter would)."""
    from laned.core import inputs as i
    from laned.core.machine import Context, step

    context = Context(now, now, records.config.lanes[lane])
    for made in (lambda r: i.Adopt("start"), lambda r: i.Ready(r.run, "ready", None)):
        record = records.statuses[lane]
        records.book.replace(lane, step(record, made(record), context).lane)


def _desire(records: Any, lane: str) -> None:
    from laned.core import inputs as i
    from laned.core.lanes import Desired
    from laned.core.machine import Context, step

    record, context = records.statuses[lane], Context(0.0, 0.0, records.config.lanes[lane])
    records.book.replace(lane, step(record, i.Desire(Desired.ACTIVE), context).lane)


def test_the_owners_scheduler_swaps_once_and_backs_off_a_failed_idle_return() -> None:
    import asyncio

    from laned.errors import PreflightFailed
    from laned.owner.records import Records
    from laned.owner.scheduler import RETRY_AFTER, Scheduler
    from laned.owner.traffic import Traffic
    from laned.owner.wiring import StateFiles

    text = GROUPS.replace('idle_return = "30m"', 'idle_return = "2s"').replace(
        "pinned = true\n", ""
    )
    config = parse_config(text, "t.toml", {"HOME": "/home/op"})

    async def scenario() -> None:
        now = [1000.0]
        records = Records(config, lambda: now[0], 252, StateFiles())
        asked: list[tuple[str, str]] = []

        def refuse(lane: str, reason: str) -> asyncio.Future[object]:
            asked.append((lane, reason))
            done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
            done.set_exception(PreflightFailed("lane a: preflight: no GPU", "fix it", []))
            return done

        scheduler = Scheduler(records, Traffic(lambda: now[0]), refuse)  # type: ignore[arg-type]
        _ready(records, "b", now[0])  # at 1000.0
        assert scheduler.decide() == 1002.0 and not asked  # idle_return: 2 s from now
        now[0] = 1002.0
        assert scheduler.decide() is None
        assert [lane for lane, _ in asked] == ["a"] and asked[0][1].startswith("back to the default lane a")  # fmt: skip
        await asyncio.sleep(0)  # the refusal reaches the scheduler
        assert [e.reason for e in records.book.events if e.kind.value == "schedule"] == [asked[0][1]]  # fmt: skip
        # Refused: not asked again at every event, but after RETRY_AFTER.
        assert scheduler.decide() == 1002.0 + RETRY_AFTER and len(asked) == 1
        now[0] += RETRY_AFTER
        scheduler.decide()
        assert len(asked) == 2

    asyncio.run(scenario())


PLACED = """
[lanes.a]
port = 8001
served_model_name = "a"
gpus = [0]
min_residency = "30s"
args = ["--gpu-memory-utilization", "0.5"]
[lanes.a.exec]
command = ["vllm", "serve", "m"]
[lanes.b]
port = 8002
served_model_name = "b"
gpus = [0]
on_demand = true
args = ["--gpu-memory-utilization", "0.4"]
[lanes.b.exec]
command = ["vllm", "serve", "m"]
[lanes.c]
port = 8003
served_model_name = "c"
gpus = [0]
on_demand = true
min_residency = "60s"
args = ["--gpu-memory-utilization", "0.6"]
[lanes.c.exec]
command = ["vllm", "serve", "m"]
"""


def test_the_owners_scheduler_starts_a_lane_that_fits_beside_the_running_one_with_no_swap() -> None:
    import asyncio

    from laned.owner.records import Records
    from laned.owner.scheduler import Scheduler
    from laned.owner.traffic import Traffic
    from laned.owner.wiring import StateFiles

    config = parse_config(PLACED, "t.toml", {"HOME": "/home/op"})

    async def scenario() -> None:
        now = [1000.0]
        records = Records(config, lambda: now[0], 252, StateFiles())
        records.gpu_totals = {0: 96 * 2**30}
        traffic = Traffic(lambda: now[0])
        asked: list[tuple[str, str]] = []

        def activate(lane: str, reason: str) -> asyncio.Future[object]:
            asked.append((lane, reason))
            _desire(records, lane)  # as an activation does at once
            return asyncio.get_running_loop().create_future()

        scheduler = Scheduler(records, traffic, activate)  # type: ignore[arg-type]
        _ready(records, "a", now[0])
        flight = traffic.enter("a")  # a is busy: it would keep its GPU against a swap
        # b (0.4) fits beside a (0.5) on GPU 0: started at once, nothing taken off.
        traffic.wait_begins("b")
        scheduler.decide()
        assert asked == [("b", asked[0][1])] and "it fits beside the lanes running" in asked[0][1]
        assert records.evictions("b").lanes == ()
        # c (0.6) fits beside b (0.4) but not beside a: it waits until a has paid for its swap
        # (its min residency, 30 s), busy as a is, and then takes a alone off.
        traffic.wait_begins("c")
        _ready(records, "b", now[0])
        assert records.evictions("c").lanes == ("a",)
        again = scheduler.decide()
        assert len(asked) == 1 and again is not None and again <= now[0] + 30.0
        now[0] += 31.0
        scheduler.decide()
        assert [lane for lane, _ in asked] == ["b", "c"]
        assert asked[1][1].endswith("a resident 31 s, past its min residency 30 s")
        flight.done()

    asyncio.run(scenario())
