"""vLLM's weight cache, the pure part: which flags the daemon gets, what the config and
preflight refuse (what vLLM refuses, with the reason and the fix), and the daemon's wrapper:
its command, its environment, and `ready`, run for real against an HTTP server; the
checkpoint laned follows by stat, the simulator's fingerprint (vLLM's headers), and the
sockets' paths within AF_UNIX's limit (issue 54)."""

from __future__ import annotations

import http.server
import json
import math
import os
import socket
import struct
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import ClassVar

import pytest

from laned.adapters.pagecache import read_checkpoint
from laned.adapters.weight_cache import held_said
from laned.config.model import Config
from laned.config.names import AF_UNIX_MAX, WEIGHTS_SOCKETS_MOUNT, weights_sockets_dir
from laned.core import checkpoint
from laned.core.facts import HostFacts, LaneFacts
from laned.engines.footprints import held_of
from laned.engines.vllm_preload import (
    SOCKET_NAME_MAX,
    WC_LENGTH,
    WEIGHT_CACHE,
    daemon_env,
    daemon_flags,
    preload_command,
    socket_findings,
    wc_message,
)
from laned.errors import ConfigError, Severity
from laned.preflight.rules import evaluate
from laned.render import plan as render
from laned.render.wrapper import engine_lines, weights_lines
from laned.sim.weightwire import fingerprint, hash_checkpoint
from laned.validation.load import load_config, parse_config
from tests.helpers import free_port
from tests.unit.test_render import ENV, EXAMPLE, golden_files


def lane(extra: str = "", command: str = '["vllm", "serve", "/m"]') -> str:
    return (
        '[lanes.x]\nport = 8100\nserved_model_name = "x"\n'
        f"weight_cache = true\n{extra}\n[lanes.x.exec]\ncommand = {command}\n"
    )


def problems(text: str) -> list[tuple[str, str, Severity]]:
    try:
        config = parse_config(text, "t.toml", {"HOME": "/home/op"})
    except ConfigError as exc:
        return [(f.where, f.message, f.severity) for f in exc.problems]
    return [(f.where, f.message, f.severity) for f in config.warnings]


def test_the_daemon_gets_the_flags_that_shape_the_weights_and_no_other() -> None:
    words = ["vllm", "serve", "/m", "--tensor-parallel-size", "2", "--max-num-seqs", "8",
             "--port", "8100", "--quantization=fp8", "--enforce-eager", "--dtype", "bfloat16",
             "--tool-call-parser", "glm45", "--enable-auto-tool-choice",
             "--max_model_len", "4096", "--trust-remote-code"]  # fmt: skip
    assert preload_command(words) == [
        "vllm", "preload", "--model", "/m", "--tensor-parallel-size", "2", "--quantization=fp8",
        "--dtype", "bfloat16", "--trust-remote-code",
    ]  # fmt: skip
    assert preload_command(["python", "-m", "vllm.entrypoints.openai.api_server"]) is None
    assert daemon_flags(["--max-num-seqs", "8", "--kv-cache-dtype", "fp8"]) == [
        "--kv-cache-dtype",
        "fp8",
    ]


def test_the_daemon_keeps_no_expandable_segments() -> None:
    assert daemon_env("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True") is not None
    value, why = daemon_env("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.8,expandable_segments:True") or ("", "")  # fmt: skip
    assert value == "garbage_collection_threshold:0.8" and "pidfd_getfd" in why
    assert daemon_env("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.8") is None
    assert daemon_env("NCCL_CUMEM_ENABLE", "0") is None


@pytest.mark.parametrize(
    ("extra", "where", "says"),
    [
        ("sleep_level = 1", "lanes.x.weight_cache", "cannot go with sleep_level = 1"),
        ('engine = "sglang"', "lanes.x.weight_cache", "runs SGLang, which has none"),
        ("gpus = []", "lanes.x.weight_cache", "CUDA and ROCm only"),
        ('args = ["--load-format", "auto"]', "lanes.x.args", "--load-format is laned's"),
        ('args = ["--quantization", "awq"]', "lanes.x.weight_cache", "cannot hold it"),
        ('args = ["--master-port", "18101"]', "lanes.x.weight_cache", "the engine's --master-port"),
    ],
)
def test_the_config_refuses_what_vllm_refuses(extra: str, where: str, says: str) -> None:
    found = [(w, m) for w, m, s in problems(lane(extra)) if s is Severity.ERROR]
    assert any(w == where and says in m for w, m in found), found


def test_the_daemons_ports_stay_apart_from_every_lanes() -> None:
    other = '[lanes.y]\nport = 18100\nserved_model_name = "y"\n[lanes.y.exec]\ncommand = ["vllm", "serve", "/n"]\n'
    found = problems(lane() + other)  # x's daemon: 18100 (its port + 10000), 18101, 18102
    assert any("its daemon's port 18100 is also lane y's port" in m for _w, m, _s in found), found
    twin = other.replace("[lanes.y]\nport = 18100", "[lanes.y]\nport = 8101").replace(
        'served_model_name = "y"', 'served_model_name = "y"\nweight_cache = { health_port = 18102 }'
    )
    found = problems(lane() + twin)
    assert any("is also the weight-cache daemon's of lane x" in m for _w, m, _s in found), found


def test_the_status_table_shows_the_daemon_where_a_lane_has_one() -> None:
    from laned.cli.client import table

    base = {"state": "ready", "desired": "active", "port": 1, "served_model_name": "m",
            "restarts": 0}  # fmt: skip
    cached = {**base, "name": "x", "weight_cache": {"state": "ready", "held_bytes": 41 * 2**30}}
    shown = table([cached, {**base, "name": "y", "weight_cache": None}])
    assert "WEIGHTS" in shown.splitlines()[0] and "ready 41.0 GiB" in shown
    assert "WEIGHTS" not in table([{**base, "name": "y"}])


def test_a_command_without_serve_and_a_container_without_host_ipc_are_refused() -> None:
    found = problems(lane(command='["python", "-m", "vllm.entrypoints.openai.api_server"]'))
    assert any("has no `serve MODEL`" in m for _w, m, _s in found), found
    container = (
        '[lanes.x]\nport = 8100\nserved_model_name = "x"\nweight_cache = true\n'
        '[lanes.x.container]\nimage = "v"\nentrypoint = "vllm"\ncommand = ["serve", "/m"]\n'
    )
    found = problems(container)
    assert any("IPC namespace" in m for _w, m, _s in found), found


def test_a_plugins_quantization_is_a_warning_and_a_held_one_nothing() -> None:
    found = problems(lane('args = ["--quantization", "exl3"]'))
    assert [s for w, _m, s in found if w == "lanes.x.weight_cache"] == [Severity.WARNING]
    assert not [f for f in problems(lane('args = ["--quantization", "fp8"]')) if "weight" in f[0]]
    config = parse_config(
        lane("weight_cache = false").replace("weight_cache = true\n", ""), "t", ENV
    )
    assert config.lanes["x"].weight_cache is None


def test_preflight_reads_the_checkpoints_quantization_and_says_when_no_gpu_is_seen() -> None:
    spec = parse_config(lane(), "t.toml", ENV).lanes["x"]
    facts = LaneFacts(host=HostFacts(None, "NVML is absent"), model_quantization="gptq")
    found = evaluate("x", spec, facts)
    assert any(
        f.severity is Severity.ERROR and "'gptq'" in f.message and "config.json" in f.message
        for f in found
    ), found
    assert any(f.severity is Severity.WARNING and "CUDA GPU" in f.message for f in found), found


def test_the_example_glm_lane_keeps_its_weights_in_a_daemon_of_its_own() -> None:
    example = load_config(EXAMPLE, ENV).model_copy(update={"source": "config/laned.example.toml"})
    files = golden_files(example)
    unit, daemon = files["glm53-tr3.service"], files["glm53-tr3-weights.service"]
    assert "Wants=glm53-tr3-weights.service" in unit and "glm53-tr3-weights.service" in unit
    assert "ExecStartPost=/home/op/.local/bin/glm53-tr3-serve-weights ready" in daemon
    engine = [w for _why, words in engine_lines(example, "glm53") for w in words]
    assert engine[engine.index("--load-format") + 1] == "ipc_cache"
    argv = [w for _why, words in weights_lines(example, "glm53") for w in words]
    at = argv.index("preload")
    assert argv[at - 1 : at + 3] == ["vllm-glm53-sm120", "preload", "--model", "/var/aios/models/glm53-fp8"]  # fmt: skip
    for gone in ("--port", "--served-model-name", "--max-num-seqs", "--tool-call-parser",
                 "--load-format", "--host", "--override-generation-config"):  # fmt: skip
        assert gone not in argv, gone
    assert "--tensor-parallel-size" in argv and "--weight-cache-socket-dir" in argv
    assert "glm53-tr3-weights" in argv  # its own container
    # A change the daemon does not load leaves its digest; one it does changes it.
    lanes = dict(example.lanes)
    seqs = lanes["glm53"].model_copy(
        update={"args": tuple(a for a in lanes["glm53"].args if a.flag != "--max-num-seqs")}
    )
    other = example.model_copy(update={"lanes": {**lanes, "glm53": seqs}})
    assert render.lane_digest(other, "glm53") != render.lane_digest(example, "glm53")
    from laned.render.wrapper import weights_digest

    assert weights_digest(other, "glm53") == weights_digest(example, "glm53")
    tp1 = seqs.model_copy(update={"args": tuple(a for a in seqs.args if a.flag != "--tensor-parallel-size")})  # fmt: skip
    third = example.model_copy(update={"lanes": {**lanes, "glm53": tp1}})
    assert weights_digest(third, "glm53") != weights_digest(example, "glm53")


class _Health(http.server.BaseHTTPRequestHandler):
    answers: ClassVar[list[int]] = []

    def do_GET(self) -> None:
        self.send_response(self.answers.pop(0) if len(self.answers) > 1 else self.answers[0])
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_ready_waits_for_200_and_gives_up_when_the_daemon_dies(tmp_path: Path) -> None:
    port = free_port()
    text = lane(f"weight_cache = {{ health_port = {port} }}").replace("weight_cache = true\n", "")
    config = parse_config(
        f'[daemon]\nbin_dir = "{tmp_path}"\nstate_dir = "{tmp_path}/s"\n' + text, "t", ENV
    )
    script = next(f for f in render.plan(config) if f.path.endswith("-weights"))
    path = tmp_path / "w"
    path.write_text(script.content)
    path.chmod(0o755)
    _Health.answers = [503, 503, 200]
    server = http.server.HTTPServer(("127.0.0.1", port), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        alive = subprocess.Popen(["sleep", "30"])
        env = {**os.environ, "MAINPID": str(alive.pid)}
        done = subprocess.run([str(path), "ready"], env=env, timeout=20, capture_output=True)
        assert done.returncode == 0 and not _Health.answers[1:], done.stderr
        _Health.answers = [503]
        alive.kill()
        alive.wait()
        done = subprocess.run([str(path), "ready"], env=env, timeout=20, capture_output=True)
        assert done.returncode == 1 and b"exited before it was ready" in done.stderr
    finally:
        server.shutdown()
        server.server_close()


def planted(directory: Path, name: str, memory: object) -> socket.socket:
    """A socket put in the daemon's directory by another process of the user's: it answers
    get_memory with `memory` (vLLM's wire: a length, then a pickle), to one asker at a time."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(directory / name))
    server.listen(4)

    def answer() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                (length,) = WC_LENGTH.unpack(conn.recv(WC_LENGTH.size))
                conn.recv(length)
                conn.sendall(wc_message({"status": "ok", "memory_bytes": memory}))

    threading.Thread(target=answer, daemon=True).start()
    return server


def test_a_weight_cache_reading_past_the_gpus_size_is_dropped_with_the_reason() -> None:
    """Issue 53: a socket planted in the daemon's directory said 10^15 bytes and laned showed
    them. Each rank's reading is held to the largest of the lane's GPUs, all of them together
    to their sum, and to a whole number of bytes at least 0; what is not is dropped, said."""
    gib = 2**30
    with tempfile.TemporaryDirectory(
        prefix="wc", dir="/tmp"
    ) as short:  # an AF_UNIX path: 108 bytes
        servers = [
            planted(Path(short), "vllm_weight_cache_rank0.sock", 40 * gib),
            planted(Path(short), "vllm_weight_cache_planted.sock", 10**15),
            planted(Path(short), "vllm_weight_cache_other.sock", "lots\n\x1b[2J"),
        ]
        try:
            said = held_said(short, WEIGHT_CACHE)
        finally:
            for server in servers:
                server.close()
    assert said == {"vllm_weight_cache_rank0.sock": 40 * gib,
                    "vllm_weight_cache_planted.sock": 10**15,
                    "vllm_weight_cache_other.sock": "lots\n\x1b[2J"}  # fmt: skip
    totals = {0: 96 * gib, 1: 96 * gib, 2: 48 * gib}
    held, dropped = held_of(said, totals, (0, 1))
    assert held == 40 * gib and len(dropped) == 2, dropped
    assert "planted.sock said 1000000000000000 bytes, more than the largest GPU of the lane" in dropped[1]  # fmt: skip
    assert "other.sock said str 'lots\\n\\x1b[2J', not a number of bytes" in dropped[0]
    # Negative, a bool, a float: dropped; on the lane's GPUs only (its third is not its).
    assert held_of({"a": -1, "b": True, "c": 1.5}, totals, None) == (None, [
        "a said -1 bytes", "b said bool True, not a number of bytes",
        "c said float 1.5, not a number of bytes"])  # fmt: skip
    assert held_of({"a": 50 * gib}, totals, (2,))[0] is None
    # Each within a GPU, together past the lane's: none stands.
    held, [why] = held_of({"a": 90 * gib, "b": 90 * gib}, totals, (0,))
    assert held is None and "together, more than the lane's GPUs" in why
    # No GPU read (no NVML): only what no GPU holds is refused.
    assert held_of({"a": 500 * gib}, None, None) == (500 * gib, [])
    assert held_of({"a": 10**15}, None, None)[0] is None


# --- issue 54: the sockets' paths within AF_UNIX's limit -------------------------------------


LONG = "glm-4-5-air-ud-q4_k_xl-gguf"  # a name `laned import` writes


def sockets_line(config: Config, lane_name: str) -> str:
    """The socket directory the daemon's wrapper makes, below $XDG_RUNTIME_DIR."""
    text = next(f for f in render.plan(config) if f.path.endswith(f"{lane_name}-serve-weights"))
    line = next(ln for ln in text.content.splitlines() if ln.startswith('sockets="'))
    return line.rsplit("}", 1)[1].rstrip('"')


def test_the_sockets_of_a_long_lane_name_fit_and_bind(tmp_path: Path) -> None:
    """Issue 54: `$XDG_RUNTIME_DIR/laned-weights/LANE/` and a 61-byte name made 118 bytes for
    this lane under /run/user/1000: the daemon died five times binding. The directory is now
    `lw/` and a hash of the name: with the longest runtime directory validate lets through,
    the draft's socket binds."""
    text = lane().replace("[lanes.x", f"[lanes.{LONG}")
    config = parse_config(text, "t.toml", ENV)
    below = sockets_line(config, LONG)
    assert below == "/" + weights_sockets_dir(LONG) and LONG not in below
    assert len(f"/run/user/1000{below}/".encode()) + SOCKET_NAME_MAX <= AF_UNIX_MAX
    with tempfile.TemporaryDirectory(dir="/tmp") as base:
        fits = AF_UNIX_MAX - SOCKET_NAME_MAX - len(below) - 1
        runtime = base + "/" + "r" * (fits - len(base) - 1)
        assert socket_findings(LONG, config.lanes[LONG], runtime) == []
        directory = Path(runtime + below)
        directory.mkdir(parents=True)
        name = "vllm_weight_cache_" + "0" * 32 + "_draft.sock"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bound:
            bound.bind(str(directory / name))
        [found] = socket_findings(LONG, config.lanes[LONG], runtime + "r")
    assert found.where == f"lanes.{LONG}.weight_cache"
    assert f"would be {AF_UNIX_MAX + 1} bytes long" in found.message
    assert f"more than the {AF_UNIX_MAX} an AF_UNIX path may be" in found.message
    assert f"an XDG_RUNTIME_DIR of {len(runtime)} bytes or fewer" in found.hint


def test_validate_and_preflight_refuse_sockets_that_a_runtime_directory_makes_too_long(
    tmp_path: Path,
) -> None:
    runtime = "/run/" + "u" * 60
    path = tmp_path / "laned.toml"
    path.write_text(lane())
    with pytest.raises(ConfigError) as refused:
        load_config(str(path), {**ENV, "XDG_RUNTIME_DIR": runtime})
    [problem] = refused.value.problems
    assert "AF_UNIX" in problem.message and "XDG_RUNTIME_DIR" in problem.hint
    assert load_config(str(path), {**ENV, "XDG_RUNTIME_DIR": "/run/user/1000"}).lanes
    spec = load_config(str(path), {**ENV, "XDG_RUNTIME_DIR": "/run/user/1000"}).lanes["x"]
    facts = LaneFacts(host=HostFacts((), ""), runtime_dir=runtime)
    assert any("AF_UNIX" in f.message for f in evaluate("x", spec, facts))
    # A container lane: inside its containers the sockets sit under /run/laned/weights.
    container = (
        '[lanes.x]\nport = 8100\nserved_model_name = "x"\nweight_cache = true\n'
        '[lanes.x.container]\nimage = "v"\nipc = "host"\nentrypoint = "vllm"\n'
        'command = ["serve", "/m"]\n'
    )
    spec = parse_config(container, "t.toml", ENV).lanes["x"]
    assert len(f"{WEIGHTS_SOCKETS_MOUNT}/".encode()) + SOCKET_NAME_MAX <= AF_UNIX_MAX
    assert socket_findings("x", spec, "/run/user/1000") == []
    assert len(socket_findings("x", spec, runtime)) == 1  # the host's side, where laned asks
    # A podman socket laned could not reach, where a lane runs in a container.
    path.write_text('[daemon]\npodman_socket = "/' + "p" * 120 + '"\n' + container)
    with pytest.raises(ConfigError) as refused:
        load_config(str(path), {**ENV, "XDG_RUNTIME_DIR": "/run/user/1000"})
    assert [p.where for p in refused.value.problems] == ["daemon.podman_socket"]


def test_two_lanes_whose_names_hash_to_one_socket_directory_are_refused() -> None:
    two = lane().replace("[lanes.x", "[lanes.l1098") + lane().replace(
        "[lanes.x", "[lanes.l63979"
    ).replace("port = 8100", "port = 8200")
    assert weights_sockets_dir("l1098") == weights_sockets_dir("l63979")  # found by search
    found = [(w, m) for w, m, s in problems(two) if s is Severity.ERROR]
    assert ("lanes.l63979.weight_cache", "its daemon's socket directory "
            f"($XDG_RUNTIME_DIR/{weights_sockets_dir('l1098')}) is lane l1098's too (both lane "
            "names hash to it)") in found, found  # fmt: skip


# --- issue 54: the checkpoint the daemon read ------------------------------------------------


def shard(path: Path, shapes: dict[str, list[int]], fill: int) -> None:
    """A safetensors file (an 8-byte little-endian length, the JSON header, the data): F32
    tensors of `shapes`, every byte `fill`."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes([fill]) * offset)


def test_the_checkpoint_is_each_files_stat_and_a_change_names_the_files(tmp_path: Path) -> None:
    """Issue 54: path, size, mtime and inode of every weight and config file, read by stat;
    a shard rewritten with the same shapes (a fine-tune copied over it) is a change, as is a
    new config.json; a README is not part of it. Hundreds of shards make one line."""
    model = tmp_path / "m"
    model.mkdir()
    for i in range(8):
        shard(model / f"model-{i:05d}.safetensors", {"w": [4, 4]}, 1)
    (model / "config.json").write_text("{}")
    (model / "README.md").write_text("about")
    before = read_checkpoint(str(model))
    assert [os.path.basename(f.path) for f in before] == [
        "config.json", *(f"model-{i:05d}.safetensors" for i in range(8))]  # fmt: skip
    assert read_checkpoint(str(model)) == before and checkpoint.changed(before, before) == ()
    # A new fine-tune of the same shapes: copied to a temporary name and renamed over it.
    shard(model / "tmp", {"w": [4, 4]}, 2)
    os.replace(model / "tmp", model / "model-00003.safetensors")
    (model / "README.md").write_text("about, again")
    now = read_checkpoint(str(model))
    assert checkpoint.changed(before, now) == (str(model / "model-00003.safetensors"),)
    # In place, same size: the mtime tells (a copy over the file keeps its inode).
    shard(model / "model-00005.safetensors", {"w": [4, 4]}, 3)
    os.utime(model / "model-00005.safetensors", ns=(1, 1))
    (model / "config.json").write_text('{"a": 1}')
    moved = checkpoint.changed(before, read_checkpoint(str(model)))
    assert checkpoint.said(str(model), moved) == (
        "config.json, model-00003.safetensors, model-00005.safetensors")  # fmt: skip
    many = tuple(str(model / f"s{i}") for i in range(300))
    assert checkpoint.said(str(model), many) == "s0, s1, s2, s3, s4 and 295 more"
    # Kept and read back; anything else read back is no record.
    kept = checkpoint.to_json(str(model), now)
    assert checkpoint.from_json(json.loads(json.dumps(kept))) == (str(model), now)
    assert checkpoint.from_json({"model": "/m", "files": [["/m/a", "1", 2, 3]]}) is None
    assert checkpoint.from_json(None) is None and read_checkpoint(str(tmp_path / "no")) == ()


def test_the_simulated_daemon_fingerprints_the_headers_as_vllm_and_misses_a_same_shape_fine_tune(
    tmp_path: Path,
) -> None:
    """The simulator's fingerprint follows vLLM's hash_checkpoint (protocol.py): the shards'
    names and safetensors headers only, so new values of the same shapes keep it (the stale
    weights laned must catch itself), new shapes change it, and the index's shards alone
    count; no local shard: the model's path."""
    model = tmp_path / "m"
    model.mkdir()
    shard(model / "model-1.safetensors", {"w": [4, 4], "b": [4]}, 1)
    first = hash_checkpoint(str(model))
    assert first is not None and len(first) == 32
    shard(model / "model-1.safetensors", {"w": [4, 4], "b": [4]}, 7)
    assert hash_checkpoint(str(model)) == first  # the same shapes: vLLM sees no change
    shard(model / "model-1.safetensors", {"w": [4, 8], "b": [4]}, 1)
    assert hash_checkpoint(str(model)) != first
    shard(model / "consolidated.safetensors", {"w": [9]}, 1)
    with_extra = hash_checkpoint(str(model))
    index = {"weight_map": {"w": "model-1.safetensors", "b": "model-1.safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    assert hash_checkpoint(str(model)) not in (with_extra, None)
    assert hash_checkpoint(str(tmp_path / "hub/name")) is None
    key = fingerprint(str(tmp_path / "empty"), {}, hash_checkpoint(str(tmp_path / "empty")))
    assert key["checkpoint"] == str(tmp_path / "empty")


def test_laned_alone_restarts_an_engine_that_maps_its_weights_whatever_the_manager() -> None:
    """systemd 254 and later restart a failed lane themselves (RestartSteps=): an engine that
    maps a daemon's weights is laned's to restart, which checks the daemon's checkpoint
    first."""
    example = load_config(EXAMPLE, ENV)
    files = {Path(f.path).name: f.content for f in render.plan(example, systemd_version=254)}
    assert "Restart=no" in files["glm53-tr3.service"]
    assert "StartLimitIntervalSec=0" in files["glm53-tr3.service"]
    assert "Restart=on-failure" in files["dsv41.service"]


TWO_HOSTS = """
[daemon]
host = "{host}"
[lanes.x]
port = 8100
served_model_name = "x"
weight_cache = {{ master_port = {wc} }}
nodes = [{{ host = "a", laned = "http://10.0.0.1:9000" }}, {{ host = "b", laned = "http://10.0.0.2:9000" }}]
values = {{ HEAD_IP = "10.0.0.1" }}
args = ["--tensor-parallel-size", "{tp}", "--nnodes", "${{NNODES}}", "--node-rank", "${{NODE_RANK}}", "--master-addr", "${{HEAD_IP}}", "--master-port", "29655"]
[lanes.x.exec]
command = ["vllm", "serve", "/m"]
[lanes.x.rank.1]
args = [{{ flag = "--headless" }}{more}]
"""


def two_hosts(host: str = "a", wc: int = 29600, tp: int = 2, more: str = "") -> str:
    return TWO_HOSTS.format(host=host, wc=wc, tp=tp, more=more)


def test_each_host_of_a_lane_over_two_renders_its_own_daemon_with_one_rendezvous() -> None:
    from laned.config.ranks import for_host

    assert not [p for p in problems(two_hosts()) if p[2] is Severity.ERROR]
    argvs = []
    for host in ("a", "b"):
        config = for_host(parse_config(two_hosts(host), "t.toml", ENV))
        argvs.append([w for _why, words in weights_lines(config, "x") for w in words])
    for rank, argv in enumerate(argvs):
        # vLLM's daemon.py docstring: the engine's --nnodes/--node-rank/--master-addr, plus
        # --weight-cache-master-port (the same on every node) apart from the engine's port.
        flags = " ".join(argv)
        assert f"--nnodes 2 --node-rank {rank} --master-addr 10.0.0.1" in flags, flags
        assert "--weight-cache-master-port 29600" in flags
        assert "--weight-cache-draft-master-port 29601" in flags
        assert "--headless" not in argv  # the API server's: preload's parser refuses it


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (two_hosts(wc=29655), "the engine's --master-port"),
        (two_hosts(wc=29654), "the engine's --master-port"),  # its draft group's: + 1
        (two_hosts(tp=3), "2 nodes do not evenly divide the daemons' world of 3"),
        (
            two_hosts(more=', { flag = "--master-addr", value = "10.0.0.9" }'),
            "--master-addr differ",
        ),
    ],
)
def test_a_lane_over_two_hosts_refuses_a_daemon_rendezvous_vllm_would_refuse(
    text: str, says: str
) -> None:
    found = [(w, m) for w, m, s in problems(text) if s is Severity.ERROR]
    assert any(w.startswith("lanes.x.weight_cache") and says in m for w, m in found), found
