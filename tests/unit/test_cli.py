"""The command line forgives what systemctl and podman users type: global options after the
command, token counts as vLLM writes them."""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import ClassVar

import pytest

from laned.cli.main import main
from laned.config.durations import parse_count
from laned.errors import ConfigError, ConfigRefused, Finding
from tests.helpers import ROOT

DEMO = str(ROOT / "config" / "demo.toml")


@pytest.mark.parametrize("argv", [["--config", DEMO, "validate"], ["validate", "--config", DEMO]])
def test_config_goes_before_or_after_the_command(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 0
    assert "demo.toml: valid (2 lane(s)" in capsys.readouterr().out


def test_the_option_after_the_command_wins(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", "/nonexistent.toml", "validate", "--config", DEMO]) == 0
    assert main(["--config", DEMO, "validate", "--config", "/nonexistent.toml"]) == 2
    assert "/nonexistent.toml: 1 error" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("8192", 8192),
        ("8k", 8000),
        ("8K", 8192),
        ("32K", 32768),
        ("512K", 524288),
        ("1M", 1048576),
        ("1m", 1000000),
        ("25.6k", 25600),
    ],
)
def test_token_counts_read_as_vllm_reads_them(text: str, count: int) -> None:
    assert parse_count(text) == count


@pytest.mark.parametrize("text", ["", "8x", "-1", "1.5K", "k"])
def test_what_is_not_a_count_is_refused_with_the_forms_it_takes(text: str) -> None:
    with pytest.raises(ValueError, match=r"8k|fraction"):
        parse_count(text)


def test_bench_refuses_a_bad_size_before_it_reaches_the_engine(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--config", DEMO, "bench", "dsv41", "--contexts", "8k,lots"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "'lots' is not a count" in err and "8K,16K,32K" in err


def test_the_status_table_colours_states_on_a_terminal_only() -> None:
    from laned.cli.client import table

    lanes = [
        {"name": "a", "state": "ready", "desired": "active", "port": 8000,
         "served_model_name": "m", "restarts": 0, "reason": ""},
        {"name": "bb", "state": "failed", "desired": "active", "port": 8001,
         "served_model_name": "n", "restarts": 5, "reason": "crash-loop"},
    ]  # fmt: skip
    plain, coloured = table(lanes), table(lanes, colour=True)
    assert "\033[" not in plain
    assert "\033[32mready" in coloured and "\033[31;1mfailed" in coloured
    # The colour codes do not shift the columns: stripped, both tables are the same.
    assert re.sub(r"\033\[[0-9;]*m", "", coloured) == plain


def test_init_writes_a_starter_config_and_never_overwrites_one_unasked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "cfg" / "laned.toml"
    assert main(["init", "--config", str(target), "--example", "demo"]) == 0
    out = capsys.readouterr().out
    assert target.read_text() == (ROOT / "config" / "demo.toml").read_text()
    assert "edit next:" in out and "it validates now (lanes: dsv41, glm53)" in out
    target.write_text("# mine\n")
    assert main(["init", "--config", str(target)]) == 2
    assert "exists; nothing written" in capsys.readouterr().err
    assert target.read_text() == "# mine\n"
    assert main(["init", "--config", str(target), "--force"]) == 0
    assert (tmp_path / "cfg" / "laned.toml.bak").read_text() == "# mine\n"
    assert "api_key_file" in capsys.readouterr().out  # seed 000's lanes: what to edit


def complete(words: list[str]) -> list[str]:
    """What bash completes for `words` (the last one being typed), with laned's script."""
    script = (
        'source <(laned completion bash); COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); '
        '_laned; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out = subprocess.run(
        ["bash", "-c", script, "bash", *words], capture_output=True, text=True, env=env, check=True
    )
    return [line for line in out.stdout.splitlines() if line]


def test_bash_completes_commands_options_and_lane_names_from_the_config() -> None:
    assert complete(["laned", "deac"]) == ["deactivate"]
    assert complete(["laned", "status", "--w"]) == ["--watch"]
    assert complete(["laned", "--config", DEMO, "activate", ""]) == ["dsv41", "glm53"]
    assert complete(["laned", "activate", "--config", DEMO, "g"]) == ["glm53"]
    assert complete(["laned", "--config", DEMO, "events", "--lane", "d"]) == ["dsv41"]


def test_validate_says_which_lanes_may_run_together_and_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lanes = (("big", 8001, "[0, 1]", "0.9"), ("s1", 8002, "[2, 3]", "0.45"),
             ("s2", 8003, "[2, 3]", "0.45"), ("whole", 8004, "", "0.92"))  # fmt: skip
    text = "".join(
        f'[lanes.{n}]\nport = {p}\nserved_model_name = "{n}"\n'
        + (f"gpus = {g}\n" if g else "")
        + f'args = ["--gpu-memory-utilization", "{u}"]\n[lanes.{n}.exec]\ncommand = ["vllm", "serve", "m"]\n'
        for n, p, g, u in lanes
    )
    path = tmp_path / "laned.toml"
    path.write_text(text)
    assert main(["--config", str(path), "validate"]) == 0
    out = capsys.readouterr().out
    assert "which lanes may run together (GPU memory not read here" in out
    rows = {tuple(line.split()[:3]) for line in out.splitlines() if line.startswith("  ")}
    assert ("big", "s1", "together") in rows and ("s1", "s2", "together") in rows
    assert ("s1", "whole", "apart") in rows and ("big", "whole", "apart") in rows
    assert "s1 0.45 + whole 0.92 of its memory is more than all of it" in out


def test_status_fit_shows_each_gpu_with_its_lanes_and_what_is_left() -> None:
    from laned.cli.client import fit_table
    from laned.core.facts import GpuReading, HostFacts
    from laned.core.placement import Footprint
    from laned.preflight.fit import fit_report
    from laned.validation.load import parse_config

    text = "".join(
        f'[lanes.{n}]\nport = {p}\nserved_model_name = "{n}"\ngpus = {g}\n'
        f'args = ["--gpu-memory-utilization", "{u}"]\n[lanes.{n}.exec]\ncommand = ["vllm", "serve", "m"]\n'
        for n, p, g, u in (("big", 8001, "[0]", "0.5"), ("small", 8002, "[0]", "0.25"))
    )
    lanes = parse_config(text, "t.toml", {"HOME": "/h"}).lanes
    gpu = GpuReading(0, "H100", 80 * 2**30, 0, ())
    asleep = [Footprint.asleep("nap", {0: 6 * 2**30}, 8003)]  # a sleeper: what it keeps
    body = fit_report(
        dict(lanes), HostFacts((gpu,), "", 100.0, 90.0), placed=["big", "small"], asleep=asleep
    )
    out = fit_table(body)
    assert (
        "placed now:\n  GPU 0 (80 GiB): big 40.0 GiB, small 20.0 GiB, nap 6.0 GiB asleep; "
        "14.0 GiB left" in out
    )
    assert "  big              small            together  both fit on GPU 0" in out


class _Laned(http.server.BaseHTTPRequestHandler):
    """A stand-in for laned's POST /reload: each request takes the next canned answer."""

    answers: ClassVar[list[tuple[int, dict[str, object]]]] = []
    asked = 0

    def do_POST(self) -> None:
        type(self).asked += 1
        status, body = self.answers.pop(0)
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_laned_reload_says_what_was_applied_and_fails_on_a_refusal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    applied = {
        "applied": True,
        "changed": [],
        "restart_needed": ["dsv41"],
        "keys": {"lanes.dsv41.args": "next start", "lanes.dsv41.stop_timeout": "live"},
    }
    refused = {"error": {"code": "reload-refused", "message": "the new config cannot be applied while laned runs", "hint": "daemon.listen changed: only a restart of laned applies it"}}  # fmt: skip
    bad = {"error": {"code": "bad-config", "message": "t.toml: 1 error in the config\n  lanes.a.port: not an integer", "hint": "fix the file"}}  # fmt: skip
    _Laned.answers = [(200, applied), (200, {**applied, "keys": {}, "restart_needed": []}),
                      (409, refused), (400, bad)]  # fmt: skip
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Laned)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    argv = ["--config", DEMO, "reload", "--url", f"http://127.0.0.1:{server.server_port}"]
    try:
        assert main(argv) == 0
        out = capsys.readouterr().out.splitlines()
        assert out == [
            "applied now: lanes.dsv41.stop_timeout",
            "at the lane's next start: lanes.dsv41.args",
            "waiting for a restart: dsv41 (runs as it started until then; `laned restart LANE` applies it)",
        ]
        assert main(argv) == 0 and capsys.readouterr().out == "nothing changed\n"
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert "not reloaded: the new config cannot" in err and "daemon.listen changed" in err
        assert main(argv) == 2 and "lanes.a.port: not an integer" in capsys.readouterr().err
        # A config file that does not load is said here, and laned is not asked.
        broken = tmp_path / "laned.toml"
        broken.write_text("[lanes.a]\nport = 'x'\n")
        asked = _Laned.asked
        assert main([*argv[:1], str(broken), *argv[2:]]) == 2
        err = capsys.readouterr().err
        assert "lanes.a.port" in err and "not reloaded" in err and _Laned.asked == asked
    finally:
        server.shutdown()
        server.server_close()


def test_sighup_reloads_as_post_reload_does_and_logs_what_it_did(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`laned serve`'s SIGHUP handler calls POST /reload's own Reload and logs its result; a
    bad or refused config is logged with its key, and nothing else happens."""
    from laned.daemon import reload_on_hangup

    results: list[object] = [
        {"keys": {"lanes.a.aliases": "live"}, "restart_needed": []},
        ConfigError("t.toml", [Finding("lanes.a.port", "not an integer", "e.g. 8001")]),
        ConfigRefused("the new config cannot be applied while laned runs", "daemon.listen changed"),
    ]

    async def reload() -> dict[str, object]:
        result = results.pop(0)
        if isinstance(result, Exception):
            raise result
        return result  # type: ignore[return-value]

    caplog.set_level(logging.INFO, logger="laned")
    for _ in range(3):
        asyncio.run(reload_on_hangup(reload, "t.toml"))  # type: ignore[arg-type]
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "laned"]
    assert said[1] == ("INFO", "SIGHUP: reloaded t.toml: applied now: lanes.a.aliases")
    assert said[3][0] == "ERROR" and "t.toml: lanes.a.port: not an integer" in said[3][1]
    assert "running config stays in force" in said[3][1]
    assert said[5] == ("ERROR", "SIGHUP: not reloaded, the running config stays in force: the new config cannot be applied while laned runs (daemon.listen changed)")  # fmt: skip
