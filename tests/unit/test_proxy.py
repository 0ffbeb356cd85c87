"""Routing by model name (laned.api.proxy.route), on-demand rules and request counts, without I/O."""

from __future__ import annotations

import asyncio

from laned.api.proxy import model_names, route
from laned.cli.client import table
from laned.core.lanes import Desired, LaneState, LaneStatus
from laned.core.modes import Mode
from laned.owner.traffic import Traffic
from laned.validation.load import parse_config

TEXT = """
[lanes.dsv41]
port = 8004
served_model_name = "deepseek-v4.1-flash"
aliases = ["dsv4", "deepseek"]
[lanes.dsv41.exec]
command = ["/bin/engine"]
[lanes.dsv41-long]
port = 8004
served_model_name = "deepseek-v4.1-flash"
[lanes.dsv41-long.exec]
command = ["/bin/engine"]
[lanes.glm53]
port = 8005
group = "other"
served_model_name = "glm-5.3"
[lanes.glm53.exec]
command = ["/bin/engine"]
"""
CONFIG = parse_config(TEXT, "t.toml", {"HOME": "/home/op"})


def statuses(**states: tuple[LaneState, Desired]) -> dict[str, LaneStatus]:
    out = {n: LaneStatus(n) for n in CONFIG.lanes}
    for name, (state, desired) in states.items():
        out[name.replace("_", "-")] = LaneStatus(name.replace("_", "-"), Mode(state.value), desired)
    return out


def test_a_model_routes_to_the_lane_that_answers_to_it_aliases_too() -> None:
    idle = statuses()
    assert route(CONFIG, idle, "glm-5.3") == "glm53"
    assert route(CONFIG, idle, "dsv4") == route(CONFIG, idle, "deepseek") == "dsv41"
    assert route(CONFIG, idle, "gpt-4o") is None
    assert model_names(CONFIG, "dsv41") == ["deepseek-v4.1-flash", "dsv4", "deepseek"]


def test_of_two_configurations_of_one_model_the_desired_one_is_chosen() -> None:
    assert route(CONFIG, statuses(), "deepseek-v4.1-flash") == "dsv41"  # the first by name
    long = statuses(dsv41_long=(LaneState.STARTING, Desired.ACTIVE))
    assert route(CONFIG, long, "deepseek-v4.1-flash") == "dsv41-long"
    running = statuses(dsv41_long=(LaneState.READY, Desired.INACTIVE))
    assert route(CONFIG, running, "deepseek-v4.1-flash") == "dsv41-long"


def test_a_lane_says_on_demand_and_its_drain_timeout() -> None:
    text = TEXT.replace('served_model_name = "glm-5.3"', 'served_model_name = "glm-5.3"\non_demand = true\ndrain_timeout = "5m"')  # fmt: skip
    config = parse_config(text, "t.toml", {"HOME": "/home/op"})
    assert config.lanes["glm53"].on_demand and config.lanes["glm53"].drain_timeout == 300
    assert not config.lanes["dsv41"].on_demand and config.lanes["dsv41"].drain_timeout == 120


def test_traffic_counts_each_request_once_and_a_drain_ends_when_the_last_one_does() -> None:
    async def scenario() -> None:
        now = [100.0]
        traffic = Traffic(lambda: now[0])
        assert await traffic.drain("a", 0.01) == 0  # nothing in flight: at once
        first, second = traffic.enter("a"), traffic.enter("a")
        first.done()
        first.done()  # twice (the body's end and the response's background): counted once
        assert traffic.counts("a") == {"in_flight": 1, "queued": 0, "oldest_wait": 0.0}
        assert await traffic.drain("a", 0.01) == 1  # the deadline passes
        drain = asyncio.ensure_future(traffic.drain("a", 10))
        await asyncio.sleep(0)
        assert not drain.done()
        second.done()
        assert await drain == 0
        assert traffic.quiet_since("a") == 100.0  # since its last request ended
        assert traffic.quiet_since("c") == 0.0  # nothing ever waited for it or flew
        arrived = traffic.wait_begins("b")
        now[0] = 141.0
        assert traffic.counts("b") == {"in_flight": 0, "queued": 1, "oldest_wait": 41.0}
        assert traffic.quiet_since("b") is None and traffic.last_request("b") == 100.0
        traffic.wait_ends("b", arrived)
        assert traffic.counts("b")["queued"] == 0 and traffic.quiet_since("b") == 141.0

    asyncio.run(scenario())


def test_laned_status_shows_the_endpoints_requests_per_lane() -> None:
    lane = {
        "name": "glm53", "state": "ready", "desired": "active", "port": 8005,
        "served_model_name": "glm-5.3", "restarts": 0, "engine_name": "sglang",
        "proxy": {"in_flight": 2, "queued": 3, "oldest_wait": 41.2},
    }  # fmt: skip
    header, row = table([lane, {**lane, "name": "idle", "proxy": {"in_flight": 0, "queued": 0}}]).splitlines()[:2]  # fmt: skip
    assert "REQUESTS" in header and "2 in flight, 3 queued (oldest 41 s)" in row
    assert (
        table([{**lane, "proxy": {"in_flight": 0, "queued": 0}}]).splitlines()[1].split()[6] == "-"
    )
    assert header.split()[4] == "ENGINE" and row.split()[4] == "sglang"
