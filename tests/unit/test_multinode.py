"""Lanes over several hosts, the pure part: each host resolves its own rank (placeholders,
rank args and env), refuses what cannot run, and leaves other hosts' lanes alone."""

from __future__ import annotations

import pytest

from laned.errors import BadImport, ConfigError, Severity
from laned.importer.translate import import_run
from laned.render.wrapper import engine_argv
from laned.validation.load import load_config, parse_config
from tests.helpers import ROOT
from tests.unit.test_import import SEEDS, seed_words

ENV = {"HOME": "/home/op"}
LANE = """
[daemon]
host = "{host}"
peer_token_file = "/home/op/.config/laned/peer-token"
[lanes.two]
port = 8000
served_model_name = "m"
nodes = [{{ host = "a", laned = "http://10.0.0.1:9000" }}, {{ host = "b", laned = "http://10.0.0.2:9000" }}]
values = {{ HEAD_IP = "10.0.0.1" }}
args = [
  {{ flag = "--nnodes", value = "${{NNODES}}" }},
  {{ flag = "--node-rank", value = "${{NODE_RANK}}" }},
  {{ flag = "--master-addr", value = "${{HEAD_IP}}" }},
]
[lanes.two.env]
VLLM_HOST_IP = "${{NODE_IP}}"
[lanes.two.exec]
command = ["vllm", "serve", "/m"]
[lanes.two.rank.0]
values = {{ NODE_IP = "10.0.0.1" }}
[lanes.two.rank.1]
values = {{ NODE_IP = "10.0.0.2" }}
args = [{{ flag = "--headless" }}]
"""


def on(host: str, text: str = LANE):  # type: ignore[no-untyped-def]
    return parse_config(text.format(host=host), env=ENV)


def test_each_host_runs_its_own_rank() -> None:
    head, worker = on("a").lanes["two"], on("b").lanes["two"]
    assert head.engine_args() == ["--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1"]
    assert worker.engine_args() == [
        "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--headless",
    ]  # fmt: skip
    assert head.env["VLLM_HOST_IP"].value == "10.0.0.1"
    assert worker.env["VLLM_HOST_IP"].value == "10.0.0.2"
    # No placeholder is left for the engine to see, so validate warns of none; nor is the
    # worker's own --headless "given twice" (it is in the lane's args once, as its rank's).
    assert not [w for w in on("b").warnings if "placeholder" in w.message]
    assert not [w for w in on("b").warnings if "given twice" in w.message]
    twice = LANE.replace('args = [{{ flag = "--headless" }}]', 'args = [{{ flag = "--headless" }}, {{ flag = "--master-addr", value = "x" }}]')  # fmt: skip
    assert [w.where for w in on("a", twice).warnings if "given twice" in w.message] == [
        "lanes.two.rank.1.args[1]"
    ]


def test_a_host_outside_the_nodes_leaves_the_lane_alone() -> None:
    text = (
        LANE
        + '\n[lanes.solo]\nport = 8001\nserved_model_name = "s"\n[lanes.solo.exec]\ncommand = ["x"]\n'
    )
    config = on("c", text.replace("[daemon]\n", '[daemon]\ndefault_lane = "two"\n'))
    assert set(config.lanes) == {"solo"} and config.elsewhere == ("two",)
    assert config.daemon.default_lane is None
    (note,) = [w for w in config.warnings if w.severity is Severity.NOTE]
    assert (
        note.where == "lanes.two.nodes" and "not on this host (daemon.host = 'c')" in note.message
    )


@pytest.mark.parametrize(
    ("change", "path", "words"),
    [
        (
            ('NODE_IP = "10.0.0.2"', 'OTHER = "x"'),
            "lanes.two.rank.1",
            "${NODE_IP} has no value on rank 1 (b)",
        ),
        (("[lanes.two.rank.1]", "[lanes.two.rank.2]"), "lanes.two.rank.2", "there is no rank 2"),
        (('host = "b"', 'host = "a"'), "lanes.two.nodes", "host 'a' is listed twice"),
        (
            ("http://10.0.0.2:9000", "10.0.0.2:9000"),
            "lanes.two.nodes[1].laned",
            "is not http(s)://HOST:PORT",
        ),
    ],
)
def test_what_a_rank_cannot_run_is_refused_at_its_key(
    change: tuple[str, str], path: str, words: str
) -> None:
    with pytest.raises(ConfigError) as bad:
        on("a", LANE.replace(*change))
    assert any(p.where == path and words in p.message for p in bad.value.problems), bad.value


def test_an_empty_value_and_a_missing_peer_token_are_warnings() -> None:
    text = LANE.replace('NODE_IP = "10.0.0.2"', 'NODE_IP = ""').replace(
        'peer_token_file = "/home/op/.config/laned/peer-token"\n', ""
    )
    warnings = {(w.where, w.message.split(" (")[0]) for w in on("a", text).warnings}
    assert ("lanes.two.rank.1", "${NODE_IP} is empty on rank 1") in warnings
    assert any(path == "daemon.peer_token_file" for path, _ in warnings)


def test_rank_tables_need_nodes() -> None:
    text = '[lanes.one]\nport = 8000\nserved_model_name = "m"\n[lanes.one.exec]\ncommand = ["x"]\n[lanes.one.rank.0]\nvalues = { A = "1" }\n'
    with pytest.raises(ConfigError) as bad:
        parse_config(text, env=ENV)
    assert bad.value.problems[0].where == "lanes.one.rank"


def test_import_with_nodes_keeps_the_placeholders_for_each_rank() -> None:
    text = (SEEDS / "002-2x-dgx-spark.txt").read_text()
    nodes = [("spark-a", "http://spark-a:9000"), ("spark-b", "http://spark-b:9000")]
    lane = import_run(text, "spark", {"HEAD_IP": "10.1.0.1", "CX7_IF": "eth9"}, nodes)
    assert lane.nodes == nodes
    assert lane.values == {"HEAD_IP": "10.1.0.1", "CX7_IF": "eth9"}
    assert lane.ranks == {0: {"CX7_IB": "", "NODE_IP": ""}, 1: {"CX7_IB": "", "NODE_IP": ""}}
    assert lane.rank_args == {
        1: [("--headless", None, "a worker rank: no API server, vLLM's runtime on this host")]
    }
    assert ("--node-rank", "${NODE_RANK}", "") in lane.args  # laned fills it per rank
    with pytest.raises(BadImport, match="--nodes names 3 host"):
        import_run(text, "spark", {}, [*nodes, ("spark-c", "http://spark-c:9000")])


@pytest.mark.parametrize(("host", "rank"), [("spark-a", 0), ("spark-b", 1)])
def test_the_seed_002_lane_runs_the_seeds_argv_on_each_rank(host: str, rank: int, tmp_path) -> None:  # type: ignore[no-untyped-def]
    source = (ROOT / "config" / "seed-002-2x-dgx-spark.toml").read_text()
    path = tmp_path / "laned.toml"
    path.write_text(source.replace("[daemon]\n", f'[daemon]\nhost = "{host}"\n', 1))
    config = load_config(str(path), ENV)
    values = {"NODE_RANK": str(rank), "HEAD_IP": "192.168.100.10", "NODE_IP": f"192.168.100.1{rank}",
              "CX7_IF": "enp1s0f1np1", "CX7_IB": "rocep1s0f1"}  # fmt: skip
    theirs = [w for w in seed_words("002-2x-dgx-spark.txt")]
    for name, value in values.items():
        theirs = [w.replace(f"${{{name}}}", value) for w in theirs]
    ours = engine_argv(config, "dsv41-spark")
    image = config.lanes["dsv41-spark"].container.image  # type: ignore[union-attr]
    after = theirs[theirs.index(image) + 1 :]
    for flag in ("--port", "--served-model-name"):
        at = after.index(flag)
        del after[at : at + 2]
    expected = after + (["--headless"] if rank else [])
    # laned's own last: --port, --served-model-name, and the weight cache's loader (each
    # engine maps from its own host's daemon).
    assert ours[-4:] == ["--load-format", "ipc_cache", "--model-loader-extra-config", '{"socket_dir":"/run/laned/weights"}']  # fmt: skip
    assert ours[ours.index(image) + 1 : -8] == expected
    env = {
        w.split("=", 1)[0]: w.split("=", 1)[1]
        for i, w in enumerate(theirs)
        if i and theirs[i - 1] == "-e"
    }
    our_env = {
        w.split("=", 1)[0]: w.split("=", 1)[1]
        for i, w in enumerate(ours)
        if i and ours[i - 1] == "-e" and "=" in w
    }
    moved = {"B12X_COMPILE_CACHE_DIR", "B12X_ROCE_CACHE_DIR", "XDG_CACHE_HOME"}  # to cache_env
    assert {k: v for k, v in env.items() if k not in moved} == {
        k: v for k, v in our_env.items() if k in env and k not in moved
    }
    assert (
        our_env["XDG_CACHE_HOME"] == "/laned/cache/xdg"
        and our_env["VLLM_HOST_IP"] == values["NODE_IP"]
    )
