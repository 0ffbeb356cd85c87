"""Every daemon and lane key, changed by `POST /reload` on a running `laned serve`: the reply
sorts it as its field declares (laned.config.applied) — applied now, deferred to the lane's
next start (`restart_needed`), or refused with 409 and the reason — and what is applied is
seen to take effect (the guard's token and reads, the peers' token, the podman socket, the
proxy's view of a lane whose port or model name changed). Nothing is reported applied and
ignored; after each change the first config is reloaded and laned is as it was."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx

from laned.config.applied import Applied, applied_of
from laned.config.model import DaemonConfig, LaneConfig
from tests.helpers import free_port
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import FAST
from tests.reliability.conftest import figures, unit_property


def with_key(text: str, table: str, key: str, value: str) -> str:
    """`text` with `key = value` in `[table]` (replacing the key's line where it is set)."""
    header = f"[{table}]\n"
    start = text.index(header) + len(header)
    end = text.find("\n[", start)
    end = len(text) if end < 0 else end + 1
    body = text[start:end]
    line = re.compile(rf"^{re.escape(key)} = .*\n", re.M)
    body = line.sub(f"{key} = {value}\n", body, 1) if line.search(body) else f"{key} = {value}\n{body}"  # fmt: skip
    return text[:start] + body + text[end:]


def secret_file(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


def test_every_key_changed_by_reload_is_applied_deferred_or_refused(
    daemon: Any, tmp_path: Path, harness: Harness, units: Units
) -> None:
    api, pair_port = free_port(), free_port()
    peer = secret_file(tmp_path / "peer", "p33r-one\n")
    lanes = {
        "a": FAST,
        "c": 'restart_sec = "1s"\n[lanes.c.container]\nimage = "localhost/nothing:1"\n',
        "pair": (
            f'nodes = [{{ host = "h1", laned = "http://127.0.0.1:{api}" }}, '
            '{ host = "h2", laned = "http://127.0.0.1:1" }]\n'
        ),
    }
    serve = daemon(
        lanes,
        daemon_toml='default_lane = "a"\n',
        daemon=f'host = "h1"\npeer_token_file = "{peer}"\n',
        ports={"a": free_port(), "c": free_port(), "pair": pair_port},
        api=api,
    )
    base = serve.path.read_text()
    client = httpx.Client(base_url=serve.url, timeout=30)
    a_port = client.get("/lanes/a").json()["port"]
    a_pid = unit_property(harness, "MainPID", f"{units.name('a')}.service")
    assert unit_property(harness, "TimeoutStopUSec", f"{units.name('a')}.service") == "20s"

    def reload(text: str) -> httpx.Response:
        """With the token that some steps set (laned asks for none while none is set)."""
        serve.path.write_text(text)
        return client.post("/reload", headers={"Authorization": "Bearer t0k-one"})

    def back() -> None:
        answer = reload(base)
        assert answer.status_code == 200, answer.text
        assert client.get("/lanes/a").json()["state"] == "ready"

    def complete(prompt: str, model: str = "a") -> int:
        body = {"model": model, "prompt": prompt, "max_tokens": 2}
        return client.post("/v1/completions", json=body).status_code

    token = secret_file(tmp_path / "token", "t0k-one\n")
    peer2 = secret_file(tmp_path / "peer2", "p33r-two\n")
    a_env = secret_file(tmp_path / "a.env", "VLLM_API_KEY=sk-a\n")
    a_key = secret_file(tmp_path / "a.key", "VLLM_API_KEY=sk-b\n")
    other = free_port()
    daemon_values = {
        "listen": f'"127.0.0.1:{free_port()}"',
        "unit_dir": f'"{tmp_path}/units2"',
        "bin_dir": f'"{tmp_path}/bin2"',
        "state_dir": f'"{tmp_path}/state2"',
        "cache_dir": f'"{tmp_path}/cache2"',
        "podman": '"/usr/local/bin/podman"',
        "podman_socket": f'"{tmp_path}/nowhere.sock"',
        "token_file": f'"{token}"',
        "token_for_reads": "true",  # without a token file: refused, as `laned serve` refuses it
        "host": '"h9"',
        "peer_token_file": f'"{peer2}"',
        "default_lane": '"c"',
        "idle_return": '"10m"',
        "schedule": '"fifo"',
        "proxy": "{ queue_limit = 3 }",
        "prefetch": "{ enabled = false }",
        "limits": "{ max_body_mib = 1 }",
    }
    lane_values = {
        "description": '"now described"',
        "unit": '"other-name.service"',
        "engine": '"vllm"',  # named, as the command already says: a next-start key
        "group": '"g2"',
        "port": str(other),
        "health_path": '"/v1/models"',
        "served_model_name": '"a-renamed"',
        "aliases": '["alias-of-a"]',
        "proxy": "{ queue_limit = 2 }",
        "on_demand": "true",
        "pinned": "true",
        "priority": "3",
        "min_residency": '"30s"',
        "loading_state": "true",
        "drain_timeout": '"9s"',
        "secrets_file": f'"{a_env}"',
        "secrets": '["VLLM_API_KEY"]',  # with no secrets file: refused as a bad config
        "api_key_file": f'"{a_key}"',
        "start_timeout": '"2h"',
        "stop_timeout": '"21s"',
        "restart_sec": '"3s"',
        "restart_max_delay": '"9m"',
        "start_limit_burst": "7",
        "start_limit_interval": '"1h"',
        "sampling": "{ temperature = 0.5 }",
        "env": None,  # one more variable in the lane's env table
        "args": '["--seed", "1"]',
        "probe": '{ interval = "300ms" }',
        "model_dir": f'"{tmp_path}/models/a"',
        "gpus": "[0]",
        "needs": "{ host_memory_gib = 1 }",
        "gpu_gate": "{ enabled = false }",
        "prepare": '[["/bin/true"]]',
        "checks": "{ speed_min_tps = 1 }",
        "container": '{ image = "localhost/nothing:2" }',
        "exec": None,  # the exec table's command, changed in place
        "nodes": None,  # on `pair`
        "values": '{ X = "1" }',  # on `pair`
        "rank": '{ 1 = { args = ["--x"] } }',  # on `pair`
        "sleep_level": "1",
        "prefetch": "false",
        "dev_mode_exposed": '"a test"',
        "weight_cache": "true",
    }
    assert set(daemon_values) == set(DaemonConfig.model_fields), "a daemon key is not walked"
    assert set(lane_values) == set(LaneConfig.model_fields), "a lane key is not walked"

    seen: dict[str, str] = {}

    def walk(key: str, text: str, declared: Applied, lane: str | None) -> dict[str, Any]:
        full = f"daemon.{key}" if lane is None else f"lanes.{lane}.{key}"
        answer = reload(text)
        if declared is Applied.RESTART:
            assert answer.status_code == 409, (key, answer.text)
            error = answer.json()["error"]
            assert error["code"] == "reload-refused" and "restart of laned" in error["hint"], (key, error)  # fmt: skip
            assert reload(base).json()["keys"] == {}, f"{key}: a refused reload changed something"  # fmt: skip
            seen[full] = "refused"
            return {}
        assert answer.status_code == 200, (key, answer.text)
        reply = answer.json()
        assert reply["keys"].get(full) == declared.value, (key, reply)
        waiting = declared is Applied.NEXT_START and lane == "a"
        assert ("a" in reply["restart_needed"]) == waiting or len(reply["keys"]) > 1, (key, reply)
        seen[full] = "deferred" if waiting else declared.value
        return reply  # type: ignore[no-any-return]

    try:
        assert client.get("/lanes/c").json()["container"]["status"] == "absent"
        for key, value in daemon_values.items():
            declared = applied_of(DaemonConfig, key)
            if key == "token_for_reads":
                refused = reload(with_key(base, "daemon", key, value))
                assert refused.status_code == 409 and "token_file" in refused.text, refused.text
                value_base = with_key(base, "daemon", "token_file", f'"{token}"')
                walk(key, with_key(value_base, "daemon", key, value), declared, None)
                assert client.get("/lanes").status_code == 401  # applied: reads need the token
                assert client.get("/healthz").status_code == 200
                back()
                assert client.get("/lanes").status_code == 200
                continue
            walk(key, with_key(base, "daemon", key, value), declared, None)
            if key == "token_file":
                assert client.post("/lanes/nope/activate").status_code == 401
                auth = {"Authorization": "Bearer t0k-one"}
                assert client.post("/lanes/nope/activate", headers=auth).status_code == 404
            if key == "peer_token_file":
                ask = "/lanes/pair/deactivate?rank_only=true"
                old = client.post(ask, headers={"Authorization": "Bearer p33r-one"})
                assert old.status_code == 403, old.text
                new = client.post(ask, headers={"Authorization": "Bearer p33r-two"})
                assert new.status_code == 202, new.text
            if key == "podman_socket":
                shown = client.get("/lanes/c").json()["container"]
                assert shown["status"] == "unknown" and "nowhere.sock" in shown["error"], shown
            back()
        assert client.get("/lanes/c").json()["container"]["status"] == "absent"
        for key, value in lane_values.items():
            declared = applied_of(LaneConfig, key)
            lane = "pair" if key in ("nodes", "values", "rank") else "a"
            if key == "exec":
                text = base.replace('"sim", "serve",', '"sim", "serve", "--",', 1)
                assert text != base
            elif key == "nodes":
                text = base.replace('"http://127.0.0.1:1"', '"http://127.0.0.1:2"', 1)
            elif key == "env":
                text = with_key(base, "lanes.a.env", "EXTRA", '"1"')
            elif key == "container":
                text = with_key(base, "lanes.c.container", "image", '"localhost/nothing:2"')
            elif key == "unit":
                # Not while the lane runs (its unit is how laned finds it): deactivate first.
                refused = reload(with_key(base, "lanes.a", key, value))  # type: ignore[arg-type]
                assert refused.status_code == 409 and "deactivate it first" in refused.text
                text = with_key(base, "lanes.c", key, value)  # type: ignore[arg-type]
            elif key == "secrets":
                refused = reload(with_key(base, "lanes.a", key, value))  # type: ignore[arg-type]
                assert refused.status_code == 400 and "secrets_file" in refused.text
                text = with_key(with_key(base, "lanes.a", key, value), "lanes.a", "secrets_file", lane_values["secrets_file"])  # type: ignore[arg-type]  # fmt: skip
            else:
                text = with_key(base, f"lanes.{lane}", key, value)  # type: ignore[arg-type]
            walk(key, text, declared, "c" if key in ("container", "unit") else lane)
            if key == "port":
                # The engine runs on its old port until its restart: laned reaches it there.
                view = client.get("/lanes/a").json()
                assert view["port"] == a_port and view["state"] == "ready", view
                assert complete("still served") == 200
            if key == "served_model_name":
                assert complete("by its new name", "a-renamed") == 200
            if key == "aliases":
                assert complete("by an alias", "alias-of-a") == 200
            if key == "group":
                assert client.get("/lanes/a").json()["group"] == "g2"
            if key == "stop_timeout":
                # systemd applies it to the running unit at the reload's daemon-reload (issue 53:
                # it was reported "next start"); the engine is the one that ran before.
                unit = f"{units.name('a')}.service"
                assert unit_property(harness, "TimeoutStopUSec", unit) == "21s"
                assert unit_property(harness, "MainPID", unit) == a_pid
            back()
        assert complete("after the walk") == 200
    finally:
        client.close()
    assert len(seen) == len(daemon_values) + len(lane_values)
    figures("reload-keys", **{k: sum(v == k for v in seen.values()) for k in ("live", "deferred", "next start", "refused")})  # fmt: skip
