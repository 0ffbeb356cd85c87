"""sleep_level in the config: its rules (laned.config.sleep) and what it renders, without I/O."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from laned.adapters.gpus import held
from laned.adapters.host import cgroup_of, cgroup_pids
from laned.config.load import parse_config
from laned.core import resume
from laned.core.lanes import Desired, LaneState
from laned.errors import ConfigError, Finding, Severity
from laned.preflight.facts import GIB, GpuReading
from laned.render.units import lane_unit
from laned.render.wrapper import engine_argv, render_wrapper

ENV = {"HOME": "/home/op"}


def lanes(a: str = "", b: str = "", b_port: int = 8002) -> str:
    return (
        '[lanes.a]\nport = 8001\nserved_model_name = "a"\nsleep_level = 1\n'
        f'exec = {{ command = ["vllm", "serve", "/m/a"] }}\n{a}\n'
        f'[lanes.b]\nport = {b_port}\nserved_model_name = "b"\n'
        f'exec = {{ command = ["vllm", "serve", "/m/b"] }}\n{b}\n'
        '[lanes.c]\nport = 8003\nserved_model_name = "c"\n'
        'exec = { command = ["vllm", "serve", "/m/c"] }\n'
    )


def errors(text: str) -> list[Finding]:
    with pytest.raises(ConfigError) as bad:
        parse_config(text, "t.toml", ENV)
    return [p for p in bad.value.problems if p.severity is Severity.ERROR]


def test_a_sleeping_lane_renders_sleep_mode_dev_mode_and_loopback() -> None:
    config = parse_config(lanes(), "t.toml", ENV)
    argv = engine_argv(config, "a")
    assert "--enable-sleep-mode" in argv
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    wrapper = render_wrapper(config, "a")
    assert "export VLLM_SERVER_DEV_MODE=1" in wrapper
    assert "sleep_level = 1" in wrapper  # the reason beside the flag
    plain = engine_argv(config, "b")
    assert "--enable-sleep-mode" not in plain and "--host" not in plain
    assert "VLLM_SERVER_DEV_MODE" not in render_wrapper(config, "b")


def test_a_sleeper_conflicts_with_no_peer_and_the_others_still_do() -> None:
    config = parse_config(lanes(), "t.toml", ENV)

    def conflicts(lane: str) -> str:
        line = [x for x in lane_unit(config, lane, 252).splitlines() if x.startswith("Conflicts=")]
        return line[0] if line else ""

    assert conflicts("a") == ""
    assert conflicts("b") == "Conflicts=laned-c.service"
    assert conflicts("c") == "Conflicts=laned-b.service"


def test_an_address_others_reach_is_refused_unless_the_lane_says_why() -> None:
    found = errors(lanes(a='args = ["--host", "0.0.0.0"]'))
    assert [f.where for f in found] == ["lanes.a.args"]
    assert "/collective_rpc" in found[0].message and "dev_mode_exposed" in found[0].hint
    assert errors(lanes(a='args = ["--host=10.0.0.5"]'))[0].where == "lanes.a.args"
    exposed = lanes(a='args = ["--host", "0.0.0.0"]\ndev_mode_exposed = "behind our VPN only"')
    config = parse_config(exposed, "t.toml", ENV)
    argv = engine_argv(config, "a")
    assert argv.count("--host") == 1 and argv[argv.index("--host") + 1] == "0.0.0.0"
    parse_config(lanes(a='args = ["--host", "::1"]'), "t.toml", ENV)  # loopback: fine


def test_a_sleeper_keeps_its_port_so_no_peer_may_share_it() -> None:
    found = errors(lanes(b_port=8001))
    assert [f.where for f in found] == ["lanes.a.port"]
    assert "keeps while it sleeps" in found[0].message


def test_a_container_sleeper_needs_the_hosts_network() -> None:
    text = lanes().replace(
        'exec = { command = ["vllm", "serve", "/m/a"] }',
        'container = { image = "vllm/vllm-openai:v0.32.0", command = ["serve", "/m/a"] }',
    )
    found = errors(text)
    assert [f.where for f in found] == ["lanes.a.container.network"]
    parse_config(text.replace('command = ["serve", "/m/a"]', 'command = ["serve", "/m/a"], network = "host"'), "t.toml", ENV)  # fmt: skip


def test_dev_mode_exposed_without_sleep_is_a_warning() -> None:
    config = parse_config(lanes(b='dev_mode_exposed = "x"'), "t.toml", ENV)
    assert [w.where for w in config.warnings] == ["lanes.b.dev_mode_exposed"]


def test_a_sleeping_lane_is_left_asleep_after_the_bus_comes_back() -> None:
    config = parse_config(lanes(), "t.toml", ENV)
    now = {
        "a": resume.LaneNow(LaneState.SLEEPING, Desired.INACTIVE, True, False),
        "b": resume.LaneNow(LaneState.READY, Desired.ACTIVE, True, False),
        "c": resume.LaneNow(LaneState.INACTIVE, Desired.INACTIVE, True, False),
    }
    plans = resume.plan_catch_up(config, now)
    assert plans["a"] is resume.CatchUp.NOTHING
    assert plans["c"] is resume.CatchUp.STOP  # a lane not desired that runs, and not asleep
    gone = {**now, "a": resume.LaneNow(LaneState.SLEEPING, Desired.INACTIVE, False, False)}
    assert resume.plan_catch_up(config, gone)["a"] is resume.CatchUp.SETTLE


def test_the_gate_leaves_the_sleepers_residual_memory_out_and_no_strangers() -> None:
    limit = 1 * GIB
    # Two sleeper processes keep 3 GiB each on GPU 0 (CUDA contexts, NCCL buffers at TP>1).
    sleeping = GpuReading(0, "H200", 141 * GIB, 6 * GIB, ((1000, 3 * GIB), (1001, 3 * GIB)))
    assert held([sleeping], limit, sleepers={1000, 1001}) == []
    assert held([sleeping], limit) != []
    stranger = GpuReading(0, "H200", 141 * GIB, 8 * GIB, ((1000, 3 * GIB), (4242, 5 * GIB)))
    assert held([stranger], limit, sleepers={1000}) == ["GPU 0 has 5.00 GiB in use by pid 4242"]
    unlisted = GpuReading(0, "H200", 141 * GIB, 6 * GIB, None)  # cannot tell: all of it counts
    assert held([unlisted], limit, sleepers={1000}) == ["GPU 0 has 6.00 GiB in use"]


def test_an_engines_processes_are_its_cgroup_and_every_cgroup_below(tmp_path: Path) -> None:
    unit = tmp_path / "user.slice" / "laned-a.service"
    (unit / "engine-core").mkdir(parents=True)
    (unit / "cgroup.procs").write_text("10\n11\n")
    (unit / "engine-core" / "cgroup.procs").write_text("12\n")
    assert cgroup_pids("/user.slice/laned-a.service", str(tmp_path)) == {10, 11, 12}
    assert cgroup_pids("", str(tmp_path)) == set()
    assert cgroup_pids("/gone.service", str(tmp_path)) == set()
    assert cgroup_of(os.getpid()).startswith("/")
