"""Secrets and access: a sentinel API key and a sentinel token appear in no process's argv, no
generated file, no state file, no log line, no journal entry, no event, no metric and no API
reply (errors included); off loopback without a token laned refuses to start."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx

from laned.config.names import container_name
from laned.validation.load import load_config
from tests.helpers import ROOT, free_port, journal
from tests.integration.conftest import Harness
from tests.integration.lanes import FAST
from tests.reliability.conftest import figures, unit_property

# Every endpoint, read and write, the way a client (or an attacker) would call it.
CALLS = [
    ("GET", "/"), ("GET", "/healthz"), ("GET", "/fit"), ("GET", "/lanes"), ("GET", "/lanes/a"),
    ("GET", "/lanes/a/preflight"), ("GET", "/lanes/a/logs"), ("GET", "/events"),
    ("GET", "/metrics"), ("GET", "/sd"), ("GET", "/v1/models"), ("GET", "/lanes/nope"),
    ("POST", "/lanes/nope/activate"), ("POST", "/lanes/a/activate?wait=true"),
    ("POST", "/lanes/a/restart?wait=true&timeout=60"), ("POST", "/reload"),
    ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
]  # fmt: skip
BODY = {
    "model": "a",
    "messages": [{"role": "user", "content": "hi"}],
    "prompt": "hi",
    "max_tokens": 4,
}


def replies(url: str, headers: dict[str, str]) -> list[tuple[int, str]]:
    out = []
    with httpx.Client(base_url=url, headers=headers, timeout=90) as client:
        for method, path in CALLS:
            reply = client.request(method, path, json=BODY if method == "POST" else None)
            out.append((reply.status_code, f"{reply.headers}\n{reply.text}"))
    return out


def process_args() -> list[str]:
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            out.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue  # gone meanwhile
    return out


def engine_environ(pid: int) -> str:
    return Path(f"/proc/{pid}/environ").read_bytes().replace(b"\0", b"\n").decode()


def test_no_secret_appears_anywhere(
    harness: Harness, daemon: Any, tmp_path: Path, sim_image: str
) -> None:
    # Every secret a lane needs in one secrets file: the engine's API key and a hub token,
    # for an exec lane (a) and a container lane (c). Each must reach its engine's
    # environment, and nothing else: no argv, file, reply, journal line or log line.
    key, token = f"sk-SENTINEL-{uuid.uuid4().hex}", f"tok-SENTINEL-{uuid.uuid4().hex}"
    hub = f"hf_SENTINEL{uuid.uuid4().hex}"
    key_file, token_file = tmp_path / "a.env", tmp_path / "token"
    key_file.write_text(f"# lane a and c\nVLLM_API_KEY={key}\nHF_TOKEN={hub}\n")
    token_file.write_text(token + "\n")
    for secret in (key_file, token_file):
        secret.chmod(0o600)
    auth = {"Authorization": f"Bearer {token}"}
    secrets = f'secrets_file = "{key_file}"\nsecrets = ["VLLM_API_KEY", "HF_TOKEN"]\n'
    container = (
        FAST + secrets + 'group = "c"\ngpus = []\nenv = { LANED_SIM_STARTUP = "0.3" }\n'
        f'[lanes.c.container]\nimage = "{sim_image}"\nentrypoint = "vllm"\n'
        'command = ["serve", "/models/c"]\nnetwork = "host"\n'
    )
    serve = daemon(
        {"a": FAST + secrets, "c": container},
        daemon_toml=f'default_lane = "a"\ntoken_file = "{token_file}"\ntoken_for_reads = true\n',
        headers=auth,
        ports={"a": free_port(), "c": free_port()},
    )
    started = httpx.post(
        f"{serve.url}/lanes/c/activate", params={"wait": "true"}, headers=auth, timeout=90
    )
    assert started.status_code == 200, started.text
    # In each engine's environment, by name.
    view = httpx.get(f"{serve.url}/lanes/a", headers=auth, timeout=10).json()
    (unit_a,) = [u for u in serve.units if u.startswith(view["unit"].removesuffix(".service"))]
    wrapper = int(unit_property(harness, "MainPID", unit_a))
    (engine,) = [
        int(p) for p in Path(f"/proc/{wrapper}/task/{wrapper}/children").read_text().split()
    ]
    assert f"HF_TOKEN={hub}" in engine_environ(engine) and f"VLLM_API_KEY={key}" in engine_environ(
        engine
    )
    config = load_config(str(tmp_path / "laned.toml"), {"HOME": str(tmp_path)})
    name = container_name("c", config.lanes["c"])
    pid = int(harness.podman("inspect", "--format", "{{.State.Pid}}", name).stdout)
    assert f"HF_TOKEN={hub}" in engine_environ(pid) and f"VLLM_API_KEY={key}" in engine_environ(pid)
    answered = replies(serve.url, auth)
    assert any(code == 200 for code, _ in answered[:11]), answered[:3]
    assert [c for c, _ in answered if c >= 500 and c not in (502, 504)] == [], answered
    refused = replies(serve.url, {}) + replies(serve.url, {"Authorization": "Bearer wrong"})
    # Without laned's token every endpoint but the page and /healthz refuses (401 for none,
    # 403 for a wrong one). The OpenAI endpoint is the engines' to guard with their API key:
    # laned forwards the caller's Authorization, and the engine refuses a missing one.
    gated, openai = {}, {}
    for i, ((method, path), (code, _)) in enumerate(zip(CALLS * 2, refused, strict=True)):
        where = f"{method} {path} ({'no token' if i < len(CALLS) else 'a wrong token'})"
        if path.startswith("/v1/"):
            openai[where] = code
        elif path not in ("/", "/healthz"):
            gated[where] = code
    expected = {w: 401 if "no token" in w else 403 for w in gated}
    assert gated == expected
    assert {c for w, c in openai.items() if w.startswith("POST")} == {401}  # the engine's key
    rebound = replies(serve.url, {**auth, "Host": "evil.example:9000"})
    assert {c for c, _ in rebound} == {403}
    cross = httpx.post(
        f"{serve.url}/lanes/a/deactivate", headers={**auth, "Origin": "http://evil.example"}
    )
    assert cross.status_code == 403
    places: dict[str, str] = {
        f"reply {i}": text for i, (_, text) in enumerate(answered + refused + rebound)
    }
    places |= {f"argv {i}": a for i, a in enumerate(process_args())}
    generated = [
        *harness.unit_dir.glob(f"{serve.units[0].split('-')[0]}*"),
        *(tmp_path / "bin").glob("*"),
    ]
    generated += [p for p in (tmp_path / "state").rglob("*") if p.is_file()]
    places |= {str(p): p.read_text(errors="replace") for p in generated}
    places["laned's log"] = (tmp_path / "laned.log").read_text(errors="replace")
    places |= {f"journal of {u}": journal(u, 2000) for u in serve.units}
    places |= {"podman ps": harness.podman("ps", "-a", "--no-trunc").stdout}
    leaks = [where for where, text in places.items() if key in text or token in text or hub in text]
    assert leaks == []
    assert any('"${secret_env[@]}"' in t for w, t in places.items() if w.endswith("-serve"))
    figures("secrets", places_scanned=len(places), leaks=0, calls=len(answered + refused + rebound),
            refused_without_token=len(gated), wrong_host_refused=len(rebound))  # fmt: skip


def test_off_loopback_without_a_token_laned_refuses_to_start(
    harness: Harness, tmp_path: Path
) -> None:
    config = tmp_path / "laned.toml"
    config.write_text(
        f'[daemon]\nlisten = "0.0.0.0:{free_port()}"\nstate_dir = "{tmp_path}/state"\n'
        f'unit_dir = "{tmp_path}/units"\nbin_dir = "{tmp_path}/bin"\n'
    )
    result = subprocess.run(
        [sys.executable, "-m", "laned", "--config", str(config), "serve"],
        cwd=ROOT, env=harness.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    assert "token_file" in result.stderr + result.stdout
