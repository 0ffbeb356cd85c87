"""Malformed configs, each with the key its refusal must name (tests/reliability): syntax,
types, unknown keys, ports, names, specifiers and `$`, control characters and Unicode line
separators in every free-text place. A case is (name, TOML, key): the TOML replaces or
extends the valid BASE as its text says.

Not here, because they are accepted on purpose: env values, args and command words may hold
any character but NUL (newlines, U+2028, `%`, `$` included); each reaches the engine byte
for byte and escapes nowhere (tests/unit/test_properties.py proves it)."""

from __future__ import annotations

BASE = """[daemon]
listen = "127.0.0.1:9000"
{daemon}
[lanes.a]
port = 8001
served_model_name = "a"
{a}
[lanes.a.exec]
command = ["/bin/engine", "serve", "/m/a"]
{a_tables}
[lanes.b]
port = 8002
group = "other"
served_model_name = "b"
{b}
[lanes.b.exec]
command = ["/bin/engine", "serve", "/m/b"]
"""


def config(daemon: str = "", a: str = "", a_tables: str = "", b: str = "") -> str:
    return BASE.format(daemon=daemon, a=a, a_tables=a_tables, b=b)


def lane_named(name: str) -> str:
    """A third lane with a name given as a TOML quoted key."""
    return config() + (
        f'[lanes.{name}]\nport = 8003\ngroup = "third"\nserved_model_name = "c"\n'
        f'[lanes.{name}.exec]\ncommand = ["/bin/engine"]\n'
    )


CASES: list[tuple[str, str, str]] = [
    # syntax and types
    ("toml syntax: an unclosed table", config(a_tables="[lanes.a.env"), "line"),
    ("toml syntax: a bare word value", config(a="restart_sec = soon"), "line"),
    ("unknown top-level key", "bogus = 1\n" + config(), "bogus"),
    ("unknown daemon key", config(daemon="listn = 1"), "daemon.listn"),
    ("unknown lane key", config(a="portt = 1"), "lanes.a.portt"),
    ("unknown probe key", config(a='probe = { intervall = "1s" }'), "lanes.a.probe.intervall"),
    ("port as a string", config().replace("port = 8001", 'port = "x"'), "lanes.a.port"),
    ("port out of range", config().replace("port = 8001", "port = 70000"), "lanes.a.port"),
    ("port zero", config().replace("port = 8001", "port = 0"), "lanes.a.port"),
    ("a negative duration", config(a='restart_sec = "-1s"'), "lanes.a.restart_sec"),
    ("a duration that is not one", config(a='restart_sec = "soon"'), "lanes.a.restart_sec"),
    ("zero probe failures", config(a="probe = { failures = 0 }"), "lanes.a.probe.failures"),
    ("a zero start timeout", config(a='start_timeout = "0s"'), "lanes.a.start_timeout"),
    (
        "a negative gate threshold",
        config(a_tables="[lanes.a.gpu_gate]\nmax_used_gib = -1"),
        "lanes.a.gpu_gate.max_used_gib",
    ),
    ("gpus not numbers", config(a='gpus = ["x"]'), "lanes.a.gpus"),
    (
        "an empty exec command",
        config().replace('command = ["/bin/engine", "serve", "/m/a"]', "command = []"),
        "lanes.a.exec.command",
    ),
    ("exec and container both", config(a_tables='[lanes.a.container]\nimage = "x"'), "lanes.a"),
    ("args not a list", config(a='args = "--x"'), "lanes.a.args"),
    # ports, groups, names
    (
        "the listen port taken by a lane",
        config().replace("port = 8002", "port = 9000"),
        "lanes.b.port",
    ),
    (
        "a bad listen address",
        config().replace('listen = "127.0.0.1:9000"', 'listen = "nohost"'),
        "daemon.listen",
    ),
    ("default_lane unknown", config(daemon='default_lane = "zz"'), "daemon.default_lane"),
    ("a lane name with a space", lane_named('"a b"'), "lanes.a b"),
    ("a lane name with a slash", lane_named('"a/b"'), "lanes.a/b"),
    ("a lane name with a newline", lane_named('"a\\nb"'), "lanes."),
    ("a lane name with a NUL", lane_named('"a\\u0000b"'), "lanes."),
    ("a lane name with U+2028", lane_named('"a\\u2028b"'), "lanes."),
    ("laned's own unit as a lane's", config(a='unit = "laned.service"'), "lanes.a.unit"),
    ("a group with a space", config(a='group = "g 1"'), "lanes.a.group"),
    ("a unit outside .service", config(a='unit = "a.socket"'), "lanes.a.unit"),
    ("a unit with a path", config(a='unit = "../a.service"'), "lanes.a.unit"),
    ("a unit with a % specifier", config(a='unit = "a%i.service"'), "lanes.a.unit"),
    ("two lanes, one unit", config(a='unit = "x.service"', b='unit = "x.service"'), "unit"),
    (
        "a container name with a space",
        config().replace(
            '[lanes.b.exec]\ncommand = ["/bin/engine", "serve", "/m/b"]',
            '[lanes.b.container]\nimage = "i"\nname = "c d"',
        ),
        "lanes.b.container.name",
    ),
    (
        "an empty served_model_name",
        config().replace('served_model_name = "a"', 'served_model_name = " "'),
        "lanes.a.served_model_name",
    ),
    ("a health path without a slash", config(a='health_path = "health"'), "lanes.a.health_path"),
    # free text: control characters, line separators, specifiers, $
    ("a description with a newline", config(a='description = "one\\ntwo"'), "lanes.a.description"),
    ("a description with U+2028", config(a='description = "one\\u2028two"'), "lanes.a.description"),
    ("a description with a NUL", config(a='description = "one\\u0000two"'), "lanes.a.description"),
    (
        "a served_model_name with a newline",
        config().replace('served_model_name = "a"', 'served_model_name = "a\\nb"'),
        "lanes.a.served_model_name",
    ),
    ("an env key with =", config(a_tables='[lanes.a.env]\n"A=B" = "1"'), "lanes.a.env"),
    ("an env key with $", config(a_tables='[lanes.a.env]\n"A$B" = "1"'), "lanes.a.env"),
    ("an env key with a newline", config(a_tables='[lanes.a.env]\n"A\\nB" = "1"'), "lanes.a.env"),
    ("an env value with a NUL", config(a_tables='[lanes.a.env]\nA = "x\\u0000y"'), "lanes.a.env.A"),
    ("an argument with a NUL", config(a='args = ["--x", "a\\u0000b"]'), "lanes.a.args"),
    (
        "a command word with a NUL",
        config().replace('"/bin/engine", "serve", "/m/a"', '"/bin/engine", "se\\u0000rve"'),
        "lanes.a.exec.command",
    ),
    (
        "a prepare step with a NUL",
        config(a='prepare = [{ argv = ["/bin/true", "a\\u0000"], why = "x" }]'),
        "lanes.a.prepare",
    ),
    (
        "a token file that is a relative path",
        config(daemon='token_file = "token"'),
        "daemon.token_file",
    ),
    (
        "a volume with a relative source",
        config().replace(
            '[lanes.b.exec]\ncommand = ["/bin/engine", "serve", "/m/b"]',
            '[lanes.b.container]\nimage = "i"\nvolumes = ["rel/dir:/x"]',
        ),
        "lanes.b.container.volumes",
    ),
]
