"""The smaller holes of issue 53, each tried against `laned serve` on the real user manager as
the issue found it: a secrets file linked to /etc/shadow, a reload by SIGHUP and `laned
reload`, `/v1/models` under `token_for_reads`, SGLang's key copy after its engine ends, and a
socket planted in a weight-cache directory that says 10^15 bytes."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from laned.config.names import weights_sockets_dir
from laned.engines.vllm_preload import WC_LENGTH, wc_message
from tests.helpers import ROOT, free_port
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import FAST
from tests.integration.test_sglang import sglang_lane
from tests.integration.test_weight_cache import cache_lane
from tests.reliability.conftest import figures, unit_property

GIB = 2**30


def until(check: Callable[[], object], seconds: float, what: str) -> Any:
    """Poll `check` until it answers something true; its answer."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        answer = check()
        if answer:
            return answer
        time.sleep(0.05)
    raise AssertionError(f"not within {seconds} s: {what}")


def cli(harness: Harness, config: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """The `laned` command line, as an operator runs it beside the running laned."""
    return subprocess.run(
        [sys.executable, "-m", "laned", "--config", str(config), *argv],
        cwd=ROOT, env=harness.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def secret(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_a_secrets_file_linked_to_etc_shadow_is_refused_at_every_door(
    daemon: Any, harness: Harness, units: Units, tmp_path: Path
) -> None:
    """validate, a reload, preflight, and a forced activation with the link put in place of
    the file after laned loaded it: each refuses, each hint names /etc/shadow and never
    `chmod` of the link, the unit never starts, /etc/shadow is as it was."""
    shadow = os.stat("/etc/shadow")
    own = secret(tmp_path / "a.env", "HF_TOKEN=hf-own\n")
    serve = daemon({"a": f'{FAST}secrets_file = "{own}"\n'}, ready=0)
    good = serve.path.read_text()
    unit = f"{units.name('a')}.service"
    client = httpx.Client(base_url=serve.url, timeout=30)

    linked = tmp_path / "linked.env"
    linked.symlink_to("/etc/shadow")
    serve.path.write_text(good.replace(str(own), str(linked)))
    said = cli(harness, serve.path, "validate")
    assert said.returncode == 2, said
    assert f"lanes.a.secrets_file: {linked} is a symbolic link to /etc/shadow" in said.stderr
    assert 'secrets_file = "/etc/shadow"' in said.stderr and "chmod" not in said.stderr
    reloaded = client.post("/reload")
    assert reloaded.status_code == 400 and "symbolic link to /etc/shadow" in reloaded.text
    serve.path.write_text(good)

    # The file laned loaded, replaced by a link afterwards.
    own.unlink()
    own.symlink_to("/etc/shadow")
    preflight = client.get("/lanes/a/preflight").json()
    [finding] = [f for f in preflight["findings"] if f["check"] == "api-key"]
    assert not preflight["ok"] and "symbolic link to /etc/shadow" in finding["message"]
    assert "chmod" not in finding["hint"] and "/etc/shadow" in finding["hint"]
    forced = client.post("/lanes/a/activate", params={"force": "true", "wait": "true"})
    assert forced.status_code == 502, forced.text
    assert "symbolic link to /etc/shadow" in forced.json()["error"]["message"]
    assert unit_property(harness, "ActiveEnterTimestampMonotonic", unit) == "0"
    after = os.stat("/etc/shadow")
    assert (after.st_mode, after.st_uid, after.st_mtime_ns) == (shadow.st_mode, shadow.st_uid, shadow.st_mtime_ns)  # fmt: skip
    assert stat.S_ISLNK(os.lstat(own).st_mode)
    client.close()
    figures("secrets-link", validate=said.returncode, reload=reloaded.status_code,
            forced_activate=forced.status_code, unit_started=0)  # fmt: skip


def test_sighup_and_laned_reload_do_what_post_reload_does_and_models_follow_reads(
    daemon: Any, harness: Harness, units: Units, tmp_path: Path
) -> None:
    """SIGHUP did nothing and `laned reload` did not exist; GET /v1/models listed every lane
    and its state under token_for_reads."""
    token = secret(tmp_path / "token", "t0k-laned\n")
    auth = {"Authorization": "Bearer t0k-laned"}
    serve = daemon(
        {"a": FAST},
        daemon_toml=f'default_lane = "a"\ntoken_file = "{token}"\ntoken_for_reads = true\n',
        headers=auth,
    )
    good = serve.path.read_text()
    unit = f"{units.name('a')}.service"
    pid = unit_property(harness, "MainPID", unit)
    client = httpx.Client(base_url=serve.url, timeout=30)
    log = tmp_path / "laned.log"

    # /v1/models: the names to any caller (OpenAI's clients send the engine's key), the lanes
    # and their states only with laned's token.
    for who in ({}, {"Authorization": "Bearer sk-the-engines-key"}):
        listed = client.get("/v1/models", headers=who)
        assert listed.status_code == 200
        assert listed.json()["data"] == [{"id": "a", "object": "model", "owned_by": "laned"}]
        assert "ready" not in listed.text
    full = client.get("/v1/models", headers=auth).json()["data"]
    assert full[0]["laned"]["state"] == "ready" and full[0]["laned"]["lane"] == "a"

    # SIGHUP: the new config applied, said in laned's log.
    serve.path.write_text(good.replace('served_model_name = "a"\n', 'served_model_name = "a"\naliases = ["by-hup"]\n', 1))  # fmt: skip
    sent = time.monotonic()
    serve.process.send_signal(signal.SIGHUP)
    until(lambda: "SIGHUP: reloaded" in log.read_text(), 10, "the SIGHUP's reload in the log")
    took = time.monotonic() - sent
    assert "applied now: lanes.a.aliases" in log.read_text()
    names = [m["id"] for m in client.get("/v1/models").json()["data"]]
    assert names == ["a", "by-hup"]
    # A bad config by SIGHUP: logged with its key; everything runs on as it was.
    serve.path.write_text(good.replace(f"port = {client.get('/lanes/a', headers=auth).json()['port']}", 'port = "x"', 1))  # fmt: skip
    serve.process.send_signal(signal.SIGHUP)
    until(lambda: "SIGHUP: not reloaded" in log.read_text(), 10, "the refusal in the log")
    assert "lanes.a.port" in log.read_text().split("SIGHUP: not reloaded")[1]
    assert serve.process.poll() is None and unit_property(harness, "MainPID", unit) == pid
    assert client.get("/lanes/a", headers=auth).json()["state"] == "ready"

    # `laned reload`: what was applied; 1 for a refusal, 2 for a bad config.
    codes = []
    said = cli(harness, serve.path, "reload")
    codes.append(said.returncode)
    assert said.returncode == 2 and "lanes.a.port" in said.stderr, said
    serve.path.write_text(good.replace('stop_timeout = "20s"', 'stop_timeout = "7s"', 1))
    said = cli(harness, serve.path, "reload")
    codes.append(said.returncode)
    assert said.returncode == 0, said
    assert said.stdout.splitlines() == ["applied now: lanes.a.aliases, lanes.a.stop_timeout"]
    refused_text = serve.path.read_text().replace("[daemon]\n", '[daemon]\nhost = "elsewhere"\n', 1)
    serve.path.write_text(refused_text)
    said = cli(harness, serve.path, "reload")
    codes.append(said.returncode)
    assert said.returncode == 1 and "daemon.host changed" in said.stderr, said
    assert unit_property(harness, "MainPID", unit) == pid
    client.close()
    figures("sighup-reload", sighup_to_logged_s=round(took, 3), laned_reload_exits=codes,
            models_without_token=names)  # fmt: skip


def test_sglangs_key_copy_goes_with_its_engine_even_with_laned_killed(
    daemon: Any, harness: Harness, units: Units, tmp_path: Path
) -> None:
    """The 0600 copy of an SGLang lane's key stayed in state_dir after the lane stopped."""
    serve = daemon({"s": sglang_lane(tmp_path)}, daemon_toml='default_lane = "s"\n')
    copy = tmp_path / "state" / "lanes" / "s" / "s.api-key.yaml"
    unit = f"{units.name('s')}.service"
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    stopped = httpx.post(f"{serve.url}/lanes/s/deactivate", params={"wait": "true"}, timeout=60)
    assert stopped.status_code == 200 and not copy.exists()
    started = httpx.post(f"{serve.url}/lanes/s/activate", params={"wait": "true"}, timeout=60)
    assert started.status_code == 200 and copy.exists()  # written again for the new engine
    # laned killed, then the engine and its wrapper SIGKILLed: the unit's ExecStopPost= runs.
    serve.kill()
    killed = time.monotonic()
    harness.systemctl("kill", "--signal=SIGKILL", unit)
    until(lambda: unit_property(harness, "ActiveState", unit) in ("failed", "inactive"), 15, "the unit's end")  # fmt: skip
    assert not copy.exists()  # ExecStopPost= ran before the unit left `deactivating`
    figures("sglang-key-copy", gone_after_deactivate=True, back_at_start=True,
            gone_after_sigkill_laned_down_s=round(time.monotonic() - killed, 3))  # fmt: skip


def test_a_socket_planted_in_a_weight_cache_directory_is_not_believed(
    daemon: Any, harness: Harness, units: Units, tmp_path: Path
) -> None:
    """A socket put in the daemon's directory before its start says 10^15 bytes: laned shows
    the daemon's own 0.5 GiB and says in the lane's events why the other reading is dropped."""
    sockets = Path(harness.env["XDG_RUNTIME_DIR"]) / weights_sockets_dir("w")
    sockets.mkdir(parents=True, exist_ok=True, mode=0o700)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sockets / "vllm_weight_cache_planted.sock"))
    server.listen(4)
    asked = []

    def answer() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                (length,) = WC_LENGTH.unpack(conn.recv(WC_LENGTH.size))
                conn.recv(length)
                conn.sendall(wc_message({"status": "ok", "memory_bytes": 10**15}))
                asked.append(1)

    threading.Thread(target=answer, daemon=True).start()
    units.track(f"{units.name('w')}-weights.service")
    lane = cache_lane(tmp_path, free_port(), free_port()).replace('LANED_SIM_STARTUP = "2"', 'LANED_SIM_STARTUP = "1"')  # fmt: skip
    try:
        serve = daemon({"w": lane}, daemon_toml='default_lane = "w"\n')
        view = until(lambda: (v := httpx.get(f"{serve.url}/lanes/w", timeout=10).json())["weight_cache"]["held_bytes"] and v, 15, "the daemon's reading")  # fmt: skip
        assert view["weight_cache"]["held_bytes"] == GIB // 2 and asked
        events = httpx.get(f"{serve.url}/events", params={"lane": "w"}, timeout=10).json()
        [dropped] = [e["reason"] for e in events["events"] if "reading dropped" in e["reason"]]
        assert "vllm_weight_cache_planted.sock said 1000000000000000 bytes" in dropped
        metrics = httpx.get(f"{serve.url}/metrics", timeout=10).text
        [shown] = [line for line in metrics.splitlines() if line.startswith("laned_weight_cache_bytes")]  # fmt: skip
        assert float(shown.split()[-1]) == GIB // 2, shown
    finally:
        server.close()
        (sockets / "vllm_weight_cache_planted.sock").unlink(missing_ok=True)
    figures("weight-cache-socket", planted_said=10**15, shown=view["weight_cache"]["held_bytes"],
            metrics=float(shown.split()[-1]), dropped=dropped)  # fmt: skip
