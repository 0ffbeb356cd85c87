"""sleep_level in the config: its rules (laned.config.sleep) and what it renders, without I/O."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from laned.adapters.kernel import cgroup_of, cgroup_pids
from laned.adapters.pagecache import weights_gib
from laned.core import canary, resume
from laned.core.facts import GIB, GpuReading, HostFacts
from laned.core.gpu_memory import held
from laned.core.lanes import Desired, LaneState
from laned.engines.vllm import level_now
from laned.errors import ConfigError, Finding, Severity
from laned.preflight.fit import beside_sleepers, sleep_fit
from laned.render.units import lane_unit
from laned.render.wrapper import engine_argv, render_wrapper
from laned.validation.load import parse_config

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
    plans = resume.plan_catch_up(config, now, workers=())
    assert plans["a"] is resume.CatchUp.NOTHING
    assert plans["c"] is resume.CatchUp.STOP  # a lane not desired that runs, and not asleep
    gone = {**now, "a": resume.LaneNow(LaneState.SLEEPING, Desired.INACTIVE, False, False)}
    assert resume.plan_catch_up(config, gone, workers=())["a"] is resume.CatchUp.SETTLE


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


def test_the_canary_is_kept_per_digest_and_compared_on_token_ids_else_text() -> None:
    first = canary.Answer((11, 12, 13), " three, four")
    outcome, _ = canary.judge(None, "d1", first)
    assert outcome is canary.Outcome.RECORDED
    kept = first.to_json("d1")
    assert canary.judge(kept, "d1", first)[0] is canary.Outcome.SAME
    # The same text from other token ids is a different answer (ids are compared first).
    assert canary.judge(kept, "d1", canary.Answer((11, 12, 14), " three, four"))[0] is canary.Outcome.DIFFERENT  # fmt: skip
    wrong = canary.Answer((7, 7, 7), "▀▄▀")
    outcome, detail = canary.judge(kept, "d1", wrong)
    assert (
        outcome is canary.Outcome.DIFFERENT and "first good start answered ' three, four'" in detail
    )
    # Other flags, model or image (another digest): a new first answer, kept anew.
    assert canary.judge(kept, "d2", wrong)[0] is canary.Outcome.RECORDED
    # An engine without token ids: the text decides.
    texts = canary.Answer(None, " three, four")
    assert canary.judge(texts.to_json("d1"), "d1", canary.Answer(None, " three, four"))[0] is canary.Outcome.SAME  # fmt: skip
    assert canary.judge(texts.to_json("d1"), "d1", canary.Answer(None, "x"))[0] is canary.Outcome.DIFFERENT  # fmt: skip


def test_level_1_only_while_host_ram_holds_the_weights_else_level_2() -> None:
    assert level_now(1, 40.0, 100.0) == (1, "")  # up to 80 GiB pinned: fits in 92
    level, why = level_now(1, 50.0, 100.0)  # up to 100 GiB pinned, 100 available less 8
    assert level == 2 and "up to 100.0 GiB" in why and "50.0 GiB of" in why
    assert "8 GiB margin" in why
    assert level_now(2, 500.0, 10.0) == (2, "")  # level 2 pins nothing
    assert level_now(1, None, 10.0) == (1, "")  # unknown: the lane's own level
    # Its engine slept at level 1 before: it holds those pinned buffers already.
    assert level_now(1, 95.0, 10.0, pinned=True) == (1, "")
    assert level_now(1, 95.0, 10.0, pinned=False)[0] == 2


def test_preflight_says_which_level_a_lane_would_sleep_at_here() -> None:
    spec = parse_config(lanes(), "t.toml", ENV).lanes["a"]
    h200 = GpuReading(0, "H200", 141 * GIB, 0, ())
    roomy = HostFacts((h200,), "", mem_total_gib=256.0, mem_available_gib=200.0)
    assert sleep_fit("a", spec, roomy, 60.0) == []
    tight = HostFacts((h200,), "", mem_total_gib=128.0, mem_available_gib=100.0)
    [note] = sleep_fit("a", spec, tight, 123.0)
    assert note.severity is Severity.NOTE and "would sleep at level 2" in note.message
    cpu_only = HostFacts(None, "NVML is not installed", 64.0, 50.0)
    [warning] = sleep_fit("a", spec, cpu_only, 1.0)
    assert warning.severity is Severity.WARNING and "CUDA, ROCm and XPU only" in warning.message


def test_the_weights_are_the_models_weight_files(tmp_path: Path) -> None:
    assert weights_gib(str(tmp_path)) is None  # no weight file: unknown, not zero
    with (tmp_path / "model-00001-of-00002.safetensors").open("wb") as handle:
        handle.truncate(3 * GIB)  # sparse: its size, not its blocks
    (tmp_path / "shard").mkdir()
    with (tmp_path / "shard" / "model-00002-of-00002.safetensors").open("wb") as handle:
        handle.truncate(GIB)
    (tmp_path / "tokenizer.json").write_text("{}")
    assert weights_gib(str(tmp_path)) == 4.0
    assert weights_gib(str(tmp_path / "absent")) is None


def test_laned_status_says_how_long_an_activation_would_take_from_each_rung() -> None:
    from laned.cli.client import ready_in_cell

    lane = {"state": "sleeping", "ready_in": 0.409}
    assert ready_in_cell(lane) == "~0.4 s (wake)"
    assert ready_in_cell({"state": "inactive", "ready_in": 1320.0}) == "~22 min (cold start)"
    assert ready_in_cell({"state": "ready", "ready_in": 0.0}) == "-"
    assert ready_in_cell({"state": "sleeping", "ready_in": None}) == "-"


def test_the_next_lane_must_start_beside_what_sleepers_keep_under_vllms_own_rule() -> None:
    spec = parse_config(lanes(), "t.toml", ENV).lanes["b"]  # vLLM's default: 0.92
    gpu = GpuReading(0, "H200", 80 * GIB, 10 * GIB, ((1000, 8 * GIB), (5000, 2 * GIB)))
    [error] = beside_sleepers("b", spec, [gpu], {1000})
    # 80 × 0.92 = 73.6 GiB wanted free; the sleeper keeps 8: 72 GiB free.
    assert error.severity is Severity.ERROR and "keep 8.0 GiB" in error.message
    assert "would find 72.0 GiB" in error.message and "to 0.89 or less" in error.hint
    assert beside_sleepers("b", spec, [gpu], {5000}) == []  # 2 GiB kept: 78 free, enough
    assert beside_sleepers("b", spec, [gpu], set()) == []
    lower = parse_config(lanes(b='args = ["--gpu-memory-utilization", "0.85"]'), "t.toml", ENV)
    assert beside_sleepers("b", lower.lanes["b"], [gpu], {1000}) == []
    # A peer this swap puts to sleep counts with what it kept at its last sleep, before it moves.
    [coming] = beside_sleepers("b", spec, [gpu], {5000}, {"a": {0: 6 * GIB}, "c": {1: GIB}})
    assert "keep 8.0 GiB" in coming.message and "a: 6.0 GiB at its last sleep" in coming.message
    assert "c:" not in coming.message and "lanes.a.sleep_level = 0" in coming.hint
    assert beside_sleepers("b", spec, [gpu], set(), {"a": {0: 5 * GIB}}) == []  # 75 free


def test_a_lane_over_several_hosts_sleeps_only_where_its_engines_head_sleeps_every_rank() -> None:
    nodes = (
        '[daemon]\nhost = "h0"\n[lanes.m]\nport = 8010\nserved_model_name = "m"\nsleep_level = 1\n'
        'nodes = [{{ host = "h0", laned = "http://h0:9000" }}, {{ host = "h1", laned = "http://h1:9000" }}]\n'
        'exec = {{ command = ["{engine}", "--nnodes", "2", "--node-rank", "${{NODE_RANK}}"] }}\n'
        '[lanes.m.rank.1]\nargs = [{{ flag = "{worker}" }}]\n'
    )
    vllm = nodes.format(engine='vllm", "serve", "/m/m', worker="--headless")
    config = parse_config(vllm, "t.toml", ENV)  # vLLM's head sleeps every rank
    assert config.lanes["m"].sleep_level == 1
    sglang = nodes.format(
        engine='python", "-m", "sglang.launch_server", "--model-path", "/m/m',
        worker="--dist-init-addr",
    )
    found = [p for p in errors(sglang) if p.where == "lanes.m.sleep_level"]
    assert found and "does not sleep a lane over several hosts" in found[0].message, found
