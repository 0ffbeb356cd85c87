"""Property tests: any accepted value reaches the engine exactly as written, and none escapes its place."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from laned.errors import ConfigError
from laned.render import plan as render
from laned.render.wrapper import render_wrapper
from laned.validation.load import parse_config

# A stand-in engine that writes its argv and environment as JSON.
DUMP = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["DUMP_TO"], "w") as f:
    json.dump({"argv": sys.argv[1:], "env": dict(os.environ)}, f)
"""

text_values = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    min_size=1,
    max_size=40,
)
env_names = st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,10}\Z", fullmatch=True).filter(
    lambda n: (
        n not in {"VLLM_API_KEY", "PATH", "HOME", "DUMP_TO", "PWD", "SHLVL", "_", "OLDPWD"}
        and not n.endswith("ENGRAM_DISK")
    )
)


def toml_string(value: str) -> str:
    """A TOML basic string: backslash, quote and control characters escaped."""
    out = []
    for ch in value:
        if ch in '\\"':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def code_lines(script: str) -> list[str]:
    """The wrapper's lines that bash executes (everything but comments)."""
    return [line for line in script.split("\n") if not line.lstrip().startswith("#")]


def config_for(
    tmp: Path, arg_value: str, env_name: str, env_value: str, description: str, why: str
) -> str:
    return f"""
[daemon]
unit_dir = "{tmp}/units"
bin_dir = "{tmp}/bin"
state_dir = "{tmp}/state"
[lanes.p]
engine = "vllm"  # named: a drawn word after the program (say "SGLANG") would otherwise name it
port = 8123
served_model_name = "m"
description = {toml_string(description)}
args = [{{ flag = "--opt", value = {toml_string(arg_value)}, why = {toml_string(why)} }}, {toml_string(arg_value)}]
[lanes.p.env]
{env_name} = {{ value = {toml_string(env_value)}, why = {toml_string(why)} }}
[lanes.p.exec]
command = ["{tmp}/engine", {toml_string(arg_value)}]
"""


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arg=text_values,
    env_name=env_names,
    env_value=text_values,
    description=text_values,
    why=text_values,
)
def test_values_reach_the_engine_exactly_and_inject_nothing(
    arg: str, env_name: str, env_value: str, description: str, why: str
) -> None:
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        try:
            config = parse_config(
                config_for(tmp, arg, env_name, env_value, description, why),
                "p.toml",
                {"HOME": tmpdir},
            )
        except ConfigError as exc:
            # Rejected values are those that could break out of their place: control
            # characters in unit text, a trailing backslash, or text that looks like a flag
            # laned owns. Anything else must be accepted.
            messages = " ".join(p.message for p in exc.problems)
            assert (
                "control character" in messages
                or "backslash" in messages
                or "set by laned" in messages
            )
            event("rejected by the config checks")
            return
        event("rendered and run")
        engine = tmp / "engine"
        engine.write_text(DUMP)
        engine.chmod(0o755)
        wrapper = tmp / "serve"
        wrapper.write_text(render_wrapper(config, "p"))
        wrapper.chmod(0o755)
        dump = tmp / "dump.json"
        env = {"PATH": "/usr/bin:/bin", "DUMP_TO": str(dump)}
        result = subprocess.run([str(wrapper)], env=env, capture_output=True, text=True, timeout=30)
        assert result.returncode == 75, result.stderr  # exited 0 on its own: a failure
        seen = json.loads(dump.read_text())
        assert seen["argv"] == [
            arg,
            "--opt",
            arg,
            arg,
            "--port",
            "8123",
            "--served-model-name",
            "m",
        ]
        assert seen["env"][env_name] == env_value
        # The unit: every line is a comment, a section, or one of the keys laned writes.
        unit = render.plan(config)[0].content
        allowed = {
            "Description",
            "Conflicts",
            "After",
            "StartLimitIntervalSec",
            "StartLimitBurst",
            "Type",
            "Environment",
            "EnvironmentFile",
            "ExecStartPre",
            "ExecStart",
            "ExecStopPost",
            "KillMode",
            "Restart",
            "RestartSec",
            "TimeoutStartSec",
            "TimeoutStopSec",
        }
        keys = []
        for line in unit.split("\n"):
            if not line or line.startswith("#") or line in ("[Unit]", "[Service]"):
                continue
            key, sep, value = line.partition("=")
            assert sep and key in allowed, f"unexpected unit line {line!r}"
            keys.append(key)
            if key == "Description":
                # systemd strips surrounding whitespace from a value; the rest is kept as written
                assert value.replace("%%", "%").strip() == description.strip()
        assert keys.count("ExecStart") == 1
        # The wrapper: `why` and the description stay inside comments, whatever they hold.
        plain = parse_config(
            config_for(tmp, arg, env_name, env_value, "d", "w"), "p.toml", {"HOME": tmpdir}
        )
        assert code_lines(render_wrapper(config, "p")) == code_lines(render_wrapper(plain, "p"))
