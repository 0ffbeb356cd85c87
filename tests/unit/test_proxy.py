"""Routing by model name (laned.proxy.route), without I/O."""

from __future__ import annotations

from laned.config import parse_config
from laned.lanes import Desired, LaneState, LaneStatus
from laned.proxy import model_names, route

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
        out[name.replace("_", "-")] = LaneStatus(name.replace("_", "-"), state, desired)
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
