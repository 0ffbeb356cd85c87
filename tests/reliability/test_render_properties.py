r"""Any config that validates renders what systemd and bash accept: hypothesis builds configs of
one to three lanes (exec and container, groups, free text with `%`, `$`, quotes and any
printable Unicode, env, args, volumes, durations, secrets files whose paths end in `\`, a
space or `%`), and every unit passes
`systemd-analyze --user verify`, every wrapper `bash -n`; no unit holds a `%` that is not
`%%` or laned's own `%h`, and no value spills onto a line of its own."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from laned.adapters import rendered
from laned.errors import ConfigError
from laned.validation.load import parse_config
from tests.integration.conftest import Harness
from tests.reliability.conftest import figures

names = st.from_regex(r"\A[a-z][a-z0-9_-]{0,12}\Z", fullmatch=True)
free_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=0, max_size=30
)
durations = st.sampled_from(["500ms", "1s", "90s", "15m", "1h30m", "600"])
words = st.lists(free_text.filter(bool), min_size=0, max_size=3)
SPECIFIER = re.compile(r"%(?!%|h\b|h/)")
SEEN = {"configs": 0, "rendered": 0, "rejected": 0}


def quoted(value: str) -> str:
    return (
        '"' + "".join(f"\\u{ord(c):04x}" if c in '\\"' or ord(c) < 0x20 else c for c in value) + '"'
    )


@st.composite
def configs(draw: st.DrawFn, tmp: str) -> str:
    lanes = draw(st.lists(names, min_size=1, max_size=3, unique=True))
    text = f'[daemon]\nunit_dir = "{tmp}/units"\nbin_dir = "{tmp}/bin"\nstate_dir = "{tmp}/state"\n'
    for i, lane in enumerate(lanes):
        text += (
            f"[lanes.{lane}]\nport = {8100 + i}\nserved_model_name = {quoted(draw(free_text.filter(str.strip)))}\n"
            f'group = "g{draw(st.integers(0, 1))}"\ngpus = [{i}]\n'
            f"description = {quoted(draw(free_text))}\nrestart_sec = {quoted(draw(durations))}\n"
            f"args = [{', '.join(quoted(w) for w in draw(words))}]\n"
        )
        if draw(st.booleans()):
            # A path on a unit line (EnvironmentFile=): `%`, spaces, a trailing backslash.
            ending = draw(st.sampled_from(("", "\\", " ", "%", "%h", "\\\\")))
            text += f"secrets_file = {quoted(f'{tmp}/secrets/{draw(free_text)}{ending}')}\n"
        env = draw(
            st.dictionaries(
                st.from_regex(r"\A[A-Z][A-Z0-9_]{0,8}\Z", fullmatch=True), free_text, max_size=3
            )
        )
        if draw(st.booleans()):
            text += f'[lanes.{lane}.exec]\ncommand = ["/usr/bin/env", {", ".join(quoted(w) for w in draw(words))}]\n'
        else:
            volume = f"{tmp}/models/{draw(names)}:/models:ro"
            text += (
                f'[lanes.{lane}.container]\nimage = "localhost/x:1"\nnetwork = "host"\n'
                f"volumes = [{quoted(volume)}]\ncommand = [{', '.join(quoted(w) for w in draw(words))}]\n"
            )
        if env:
            text += f"[lanes.{lane}.env]\n" + "".join(
                f"{k} = {quoted(v)}\n" for k, v in env.items()
            )
    return text


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_every_valid_config_renders_what_systemd_and_bash_accept(
    harness: Harness, data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        text = data.draw(configs(tmp))
        SEEN["configs"] += 1
        try:
            config = parse_config(text, "p.toml", {"HOME": tmp})
        except ConfigError as exc:
            event("rejected")
            SEEN["rejected"] += 1
            assert all(p.where and p.hint for p in exc.problems if p.severity.value == "error"), exc
            return
        rendered.apply(config)
        SEEN["rendered"] += 1
        units = sorted(Path(config.daemon.unit_dir).glob("*.service"))
        wrappers = sorted(Path(config.daemon.bin_dir).glob("*-serve"))
        assert len(units) == len(wrappers) == len(config.lanes)
        verify = subprocess.run(
            ["systemd-analyze", "--user", "verify", *map(str, units)],
            env=harness.env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        problems = [line for line in (verify.stdout + verify.stderr).splitlines() if line.strip()]
        assert verify.returncode == 0 and problems == [], (problems, text)
        for wrapper in wrappers:
            syntax = subprocess.run(
                ["bash", "-n", str(wrapper)], capture_output=True, text=True, check=False
            )
            assert syntax.returncode == 0, (syntax.stderr, text)
        for unit in units:
            for line in unit.read_text().split("\n"):
                assert line == "" or line.startswith(("#", "[")) or "=" in line, (line, text)
                if not line.startswith("#"):
                    assert not SPECIFIER.search(line.replace("%%", "")), (line, text)
        event("rendered")


def test_the_render_properties_ran_on_configs_that_render(harness: Harness) -> None:
    """The property above must not pass by rejecting everything it draws."""
    test_every_valid_config_renders_what_systemd_and_bash_accept(harness)
    assert SEEN["rendered"] >= 20, SEEN
    figures("render-properties", **SEEN)
