"""Bad input: every malformed config refused at its key with a hint, and `POST /reload` with
each leaves the running lane, its unit and laned's config untouched (checked, not assumed)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from laned.errors import ConfigError, Severity
from laned.validation.load import load_config, parse_config
from tests.integration.conftest import Harness
from tests.integration.lanes import FAST
from tests.reliability.bad_configs import CASES
from tests.reliability.conftest import figures, unit_property


@pytest.mark.parametrize(("name", "text", "key"), CASES, ids=[c[0] for c in CASES])
def test_a_malformed_config_is_refused_at_its_key_with_a_hint(
    name: str, text: str, key: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(text, "laned.toml", {"HOME": "/home/op"})
    errors = [p for p in refused.value.problems if p.severity is Severity.ERROR]
    where = [p for p in errors if key in p.where or (key == "line" and "line" in p.message)]
    assert where, f"{name}: no error at {key!r}: {[p.render() for p in errors]}"
    assert all(p.hint for p in where), f"{name}: an error without a hint: {where}"


def snapshot(harness: Harness, serve: Any, unit: str) -> dict[str, Any]:
    """What a bad reload must not change: the lanes' views, the engine's process, the unit
    and wrapper files, laned's own config as its API shows it."""
    files = sorted(harness.unit_dir.glob(unit)) + sorted((serve.path.parent / "bin").glob("*"))
    lanes = httpx.get(f"{serve.url}/lanes", timeout=10).json()["lanes"]
    return {
        "lanes": [(v["name"], v["state"], v["desired"], v.get("port")) for v in lanes],
        "pid": unit_property(harness, "MainPID", unit),
        "files": {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files},
    }


def test_reloading_each_malformed_config_leaves_everything_running_as_it_was(
    harness: Harness, daemon: Any
) -> None:
    serve = daemon({"a": FAST}, daemon_toml='default_lane = "a"\n')
    unit = next(u for u in serve.units if "-a." in u)
    good = serve.path.read_text()
    before = snapshot(harness, serve, unit)
    assert before["pid"] not in ("", "0") and before["lanes"][0][1] == "ready"
    refused = 0
    try:
        for name, text, _key in CASES:
            serve.path.write_text(text)
            reply = httpx.post(f"{serve.url}/reload", timeout=30)
            assert reply.status_code == 400, f"{name}: {reply.status_code} {reply.text}"
            error = reply.json()["error"]
            assert error["code"] == "bad-config" and error["hint"], name
            refused += 1
    finally:
        serve.path.write_text(good)
    after = snapshot(harness, serve, unit)
    assert after == before
    # The running config is the good one still: a reload of it changes nothing.
    reply = httpx.post(f"{serve.url}/reload", timeout=30)
    assert reply.status_code == 200, reply.text
    assert snapshot(harness, serve, unit) == before
    figures("bad-configs", cases=len(CASES), refused_at_key=len(CASES), reloads_refused=refused,
            engine_pid_changed=False, files_changed=0)  # fmt: skip


def test_a_unit_dir_linked_out_of_home_is_refused_and_reloading_it_changes_nothing(
    harness: Harness, daemon: Any, tmp_path: Path
) -> None:
    serve = daemon({"a": FAST}, daemon_toml='default_lane = "a"\n')
    unit = next(u for u in serve.units if "-a." in u)
    good = serve.path.read_text()
    before = snapshot(harness, serve, unit)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    link = Path(harness.env["HOME"]) / f"units-{tmp_path.name}"  # in HOME, leading out of it
    link.symlink_to(outside)
    try:
        serve.path.write_text(good.replace(str(harness.unit_dir), str(link), 1))
        with pytest.raises(ConfigError) as refused:
            load_config(str(serve.path), harness.env)
        assert [p.where for p in refused.value.problems] == ["daemon.unit_dir"]
        assert str(outside) in refused.value.problems[0].message
        reply = httpx.post(f"{serve.url}/reload", timeout=30)
        assert reply.status_code == 400 and "daemon.unit_dir" in reply.text, reply.text
    finally:
        serve.path.write_text(good)
        link.unlink()
    assert snapshot(harness, serve, unit) == before
    assert not list(outside.iterdir())  # nothing was written there
