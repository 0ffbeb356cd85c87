"""A lane's engine flags against a vLLM's argument parser (laned.validation.engine_flags): the rules
vLLM reads flags by, the nearest known flag, abbreviations, where flags are read from."""

from __future__ import annotations

import pytest

from laned.config.model import Config
from laned.errors import LanedError, Severity
from laned.validation.engine_flags import (
    KnownFlags,
    Source,
    normalize,
    parse_probe,
    source_of,
    unknown_flags,
)
from laned.validation.load import parse_config

KNOWN = KnownFlags(
    "0.32.0",
    frozenset(
        {
            "--max-model-len",
            "--kv-cache-memory-bytes",
            "--port",
            "--served-model-name",
            "--optimization-level",
            "--compilation-config",
            "--dtype",
            "-tp",
            "--tensor-parallel-size",
            "--override-generation-config",
        }
    ),
    Source(python="/opt/vllm/bin/python"),
)


def config(
    args: str, command: str = '["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]'
) -> Config:
    text = (
        '[daemon]\nunit_dir = "/tmp/u"\nbin_dir = "/tmp/b"\nstate_dir = "/tmp/s"\n'
        f'[lanes.a]\nport = 8001\nserved_model_name = "m"\nargs = {args}\n'
        f"[lanes.a.exec]\ncommand = {command}\n"
    )
    return parse_config(text, "/etc/laned.toml", {"HOME": "/home/u"})


@pytest.mark.parametrize(
    ("word", "flag"),
    [
        ("--max_model_len", "--max-model-len"),  # vLLM turns _ into - before the first dot
        ("--max-model-len=4096", "--max-model-len"),
        ("--compilation-config.mode", "--compilation-config"),  # a key of a JSON flag
        ("--compilation_config.cudagraph_mode=FULL", "--compilation-config"),
        ("-O3", "--optimization-level"),
        ("-tp", "-tp"),
        ("4096", None),
        ("-1", None),  # a value, not a flag
        ("/models/x", None),
    ],
)
def test_flags_are_read_by_vllms_own_rules(word: str, flag: str | None) -> None:
    assert normalize(word) == flag


def test_an_unknown_flag_is_a_warning_that_names_the_nearest_known_one() -> None:
    cfg = config('["--max-modle-len", "4096", "--dtype", "float32", "--no-such-thing-at-all"]')
    found = unknown_flags(cfg, "a", KNOWN)
    assert [p.where for p in found] == ["lanes.a.args[0]", "lanes.a.args[4]"]
    assert all(p.severity is Severity.WARNING for p in found)
    assert "did you mean --max-model-len?" in found[0].hint
    assert "--max-modle-len is not a flag of vLLM 0.32.0 (/opt/vllm/bin/python)" in found[0].message
    assert "did you mean" not in found[1].hint and "newer vLLM" in found[1].hint


def test_an_abbreviation_is_a_note_that_asks_for_the_whole_flag() -> None:
    # The seed's `--kv-cache-memory`: argparse takes it for --kv-cache-memory-bytes.
    found = unknown_flags(config('["--kv-cache-memory", "8589934592"]'), "a", KNOWN)
    assert len(found) == 1 and found[0].severity is Severity.NOTE
    assert found[0].hint == "write --kv-cache-memory-bytes"
    strict = KnownFlags(KNOWN.version, KNOWN.flags, KNOWN.source, abbrev=False)
    assert (
        unknown_flags(config('["--kv-cache-memory", "1"]'), "a", strict)[0].severity
        is Severity.WARNING
    )


def test_lanes_own_flags_and_the_command_after_its_module_are_checked() -> None:
    cfg = config(
        '["--dtype", "float32"]', '["/opt/vllm/bin/python", "-m", "vllm.x", "--modle", "/m"]'
    )
    found = unknown_flags(cfg, "a", KNOWN)
    assert [p.where for p in found] == ["lanes.a.exec.command[3]"]
    # laned's own flags (--port, --served-model-name) must exist in the target vLLM too.
    bare = KnownFlags("0.1", frozenset({"--dtype", "--modle"}), KNOWN.source, abbrev=False)
    paths = [p.where for p in unknown_flags(cfg, "a", bare)]
    assert paths == ["lanes.a.port", "lanes.a.served_model_name"]


def test_flags_are_read_from_the_lanes_own_python_or_a_given_one() -> None:
    lane = config("[]").lanes["a"]
    assert source_of(lane, None) == Source(python="/opt/vllm/bin/python")
    assert source_of(lane, "/usr/bin/python3") == Source(python="/usr/bin/python3")
    script = config("[]", '["/opt/venv/bin/vllm", "serve", "/m"]').lanes["a"]
    assert source_of(script, None) == Source(python="/opt/venv/bin/python")


def test_a_probe_that_says_nothing_useful_is_a_clear_error() -> None:
    text = 'INFO some vLLM log line\n{"version": "0.32.0", "flags": ["--port"], "abbrev": true}\n'
    assert parse_probe(text, KNOWN.source).flags == frozenset({"--port"})
    with pytest.raises(LanedError, match="gave no flag list"):
        parse_probe("Traceback ...\nModuleNotFoundError: No module named 'vllm'", KNOWN.source)


def test_a_wrapper_before_the_engine_is_not_taken_for_its_flags() -> None:
    # The real_vllm tier's lane: `taskset -c 0 python -m vllm...` (-c is taskset's).
    wrapped = '["taskset", "-c", "0", "/opt/vllm/bin/python", "-m", "vllm.x", "--modle", "/m"]'
    cfg = config("[]", wrapped)
    assert [p.where for p in unknown_flags(cfg, "a", KNOWN)] == ["lanes.a.exec.command[6]"]
    assert source_of(cfg.lanes["a"], None) == Source(python="/opt/vllm/bin/python")
