"""The command line's shape: the parser (by concern: laned itself, lanes, gates, watching),
and what its common options name (the config file, laned's API)."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from laned.config.model import GATES
from laned.engines import DEFAULT, ENGINES, LISTED
from laned.errors import LanedError

if TYPE_CHECKING:
    from laned.cli.client import Client

# 0 ok, 1 the operation failed (or, with --check, files differ), 2 bad usage or a bad config.
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


# The engines whose own parser `laned validate --engine-flags` builds in a Python, and those
# whose help it reads (laned.engines: FlagProbe).
PYTHON_ENGINES = [p.title for p in LISTED if p.flag_probe.script is not None]
PYTHON_PARSERS = [f"{title}'s" for title in PYTHON_ENGINES]
HELP_PARSERS = [
    f"{p.flag_probe.program}'s {' '.join(p.flag_probe.help)}"
    for p in LISTED
    if p.flag_probe.script is None
]


def parser() -> argparse.ArgumentParser:
    """The whole command line."""
    parser = argparse.ArgumentParser(
        prog="laned",
        description="laned owns the GPU inference lanes of this host as systemd user units.",
        epilog="Config: --config PATH, else $LANED_CONFIG, else $XDG_CONFIG_HOME/laned/laned.toml.",
    )
    parser.add_argument("--config", metavar="PATH", help="the laned.toml to use")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    validate = sub.add_parser(
        "validate",
        help="check the config and report every problem",
        description="Check the config; print every error and warning with its key path. "
        "Exit 0 when it is valid, 2 when it is not.",
    )
    validate.add_argument(
        "--engine-flags",
        action="store_true",
        help="also check each lane's flags against its engine's own argument parser: "
        f"{' and '.join(PYTHON_PARSERS)} in the lane's Python (exec lanes) or image (podman, "
        f"never pulled), {', '.join(HELP_PARSERS)}; unknown flags are warnings, with the "
        "nearest known flag",
    )
    validate.add_argument(
        "--python",
        metavar="PATH",
        help=f"with --engine-flags: the interpreter whose {' or '.join(PYTHON_ENGINES)} to "
        "ask, for every lane of that engine",
    )
    render = sub.add_parser(
        "render",
        help="write lane units and serve wrappers",
        description="Write each lane's systemd unit (unit_dir) and serve wrapper (bin_dir) "
        "atomically, remove laned's files of lanes that left the config, and print what "
        "changed. A second run changes nothing.",
    )
    render.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 with a diff when anything on disk differs",
    )
    sub.add_parser("version", help="print laned's version", description="Print laned's version.")
    sub.add_parser(
        "serve",
        help="run the daemon: supervise the lanes",
        description="Render the lanes, reload systemd, adopt what runs, start the desired lane "
        "(or daemon.default_lane) and supervise until SIGTERM; SIGHUP reloads the config "
        "(as POST /reload). The lanes keep running when laned stops.",
    )

    sub.add_parser(
        "install",
        help="install laned.service (enabled, started)",
        description="Write laned's own unit to unit_dir, reload systemd, enable it (default.target) and "
        "(re)start it, so laned comes up at boot and restores the lane that should run.",
    )

    imports = sub.add_parser(
        "import",
        help="turn a published docker/podman run command line into a lane table",
        description="Read a `docker run` or `podman run` command line (a recipe's, prose around "
        "it is fine) and print a lane table for laned.toml: every option and engine flag carried "
        "over, what rootless podman under systemd cannot take translated with a note, the "
        "`needs` line to fill in. See docs/import.md.",
    )
    imports.add_argument("source", nargs="?", metavar="FILE", help="the recipe; - or none: stdin")
    imports.add_argument("--file", dest="file", metavar="FILE", help="the same as FILE")
    imports.add_argument("--name", help="the lane's name (default: from the served model name)")
    imports.add_argument(
        "--nodes",
        action="append",
        default=[],
        metavar="HOST=URL",
        help="a host of a lane over several hosts and its laned (repeat, the head first)",
    )
    imports.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a value for a ${NAME} placeholder of the command line (repeatable)",
    )
    imports.add_argument(
        "--cwd",
        metavar="DIR",
        help="the directory the recipe was run from: a relative bind mount (-v ./models:/x) "
        "is taken to be relative to it (default: the current directory)",
    )

    init = sub.add_parser(
        "init",
        help="write a starter config and say what to edit next",
        description="Copy one of laned's examples to the config path (--config, $LANED_CONFIG, "
        "else ~/.config/laned/laned.toml), say what to edit next, and validate it.",
    )
    init.add_argument(
        "--example",
        choices=("seed-000", "seed-001", "seed-002", "demo"),
        default="seed-000",
        help="seed-000: two RTX PRO 6000, DeepSeek and GLM (default); seed-001: 4x RTX PRO "
        "6000; seed-002: two DGX Spark, one lane over both; demo: the simulated engine",
    )
    init.add_argument(
        "--force", action="store_true", help="replace an existing config (kept as .bak)"
    )
    completion = sub.add_parser(
        "completion",
        help="print the shell completion script",
        description="Print bash or zsh completion for laned: source <(laned completion bash).",
    )
    completion.add_argument("shell", choices=("bash", "zsh"))
    sub.add_parser("_lanes")  # for completion: the configured lane names

    _lane_commands(sub)
    _gate_commands(sub)
    _watch_commands(sub)
    sim = sub.add_parser(
        "sim",
        help="run the simulated vLLM engine",
        description="The vLLM-compatible simulated engine: `laned sim serve MODEL [vLLM flags]`.",
        add_help=False,
    )
    sim.add_argument("sim_args", nargs=argparse.REMAINDER)
    # `laned status --config F` as well as `laned --config F status`, as systemctl and podman
    # take their global options (SUPPRESS: one given before the command is not overwritten).
    for name, command in sub.choices.items():
        if name != "sim":
            command.add_argument(
                "--config", metavar="PATH", default=argparse.SUPPRESS, help="the laned.toml to use"
            )
    return parser


def _api_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help_text: str,
    description: str,
) -> argparse.ArgumentParser:
    """A command that talks to laned's API (--url, --token-file)."""
    command = sub.add_parser(name, help=help_text, description=description)
    command.add_argument("--url", help="laned's API (default: http:// + daemon.listen)")
    command.add_argument(
        "--token-file", help="file with the API token (default: daemon.token_file)"
    )
    return command


def _lane_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """status, preflight, activate, deactivate, restart."""
    status = _api_command(
        sub, "status", "show every lane", "Show every lane's state from laned's API."
    )
    status.add_argument("--json", action="store_true", help="print the API's JSON")
    status.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=float,
        metavar="SECONDS",
        help="redraw every SECONDS (default 2) until Ctrl-C",
    )
    status.add_argument(
        "--fit",
        action="store_true",
        help="which configured lanes this host can run at all (their needs against its GPUs, memory, disk)",
    )
    _api_command(
        sub,
        "reload",
        "re-read the config and apply it (POST /reload)",
        "Ask laned to re-read its config, as POST /reload, SIGHUP and `systemctl --user reload "
        "laned` do: print the keys applied now and those that wait for a lane's next start. "
        "Exit 1 when laned refuses it (a change only a restart of laned applies), 2 for a bad "
        "config; either way the running config stays in force.",
    )
    preflight = _api_command(
        sub,
        "preflight",
        "check that LANE would start",
        "Run LANE's preflight checks (image, model and mount paths, API key file, port, needs, "
        "engine timeouts, sampling, compile cache, image drift) through laned's API, or here "
        "when laned is not running. Exit 1 when a check fails.",
    )
    preflight.add_argument("lane", metavar="LANE")
    preflight.add_argument("--json", action="store_true", help="print the findings as JSON")
    for name, verb in (
        ("activate", "start LANE, taking off the lanes it cannot run beside"),
        ("deactivate", "stop LANE"),
        ("restart", "stop and start LANE again"),
    ):
        command = _api_command(sub, name, verb, f"{verb[0].upper()}{verb[1:]} through laned's API.")
        command.add_argument("lane", metavar="LANE")
        command.add_argument(
            "--wait", action="store_true", help="follow it until it is done, with a progress line"
        )
        command.add_argument("--timeout", type=float, help="seconds to wait at most (with --wait)")
        command.add_argument(
            "--force",
            action="store_true",
            help=("start even when preflight finds errors; " if name == "activate" else "")
            + "stop without draining the requests in flight through laned's OpenAI endpoint",
        )


def _gate_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """check and bench: against a lane or any OpenAI-compatible server."""
    for name, what in (
        ("check", "run the acceptance gates against LANE"),
        ("bench", "measure LANE: decode by concurrency, prefill by context length"),
    ):
        command = _api_command(
            sub,
            name,
            what,
            (
                "Run seed 002's six gates (load, chat, reasoning, tools, context, speed) through "
                "laned's API, which keeps the results; when laned does not answer, here (not kept). "
                "Exit 1 when a gate fails."
                if name == "check"
                else "Measure the lane as the seeds do: decode tok/s at 1, 2, 4 and 8 streams (a "
                "400-token minus a 16-token reply, warm prefix), prefill tok/s at 8k/16k/32k "
                "(capped by the window) and decode at long context. Runs here, against the engine."
            ),
        )
        command.add_argument("lane", metavar="LANE", nargs="?", help="a configured lane")
        command.add_argument("--json", action="store_true", help="print JSON")
        command.add_argument(
            "--base-url", help="any OpenAI-compatible server instead of a lane (http://host:port)"
        )
        command.add_argument("--model", help="with --base-url: the served model name")
        command.add_argument(
            "--api-key-file",
            help="with --base-url: a file with the engine's key ("
            + ", ".join(f"{p.api_key_env}=..." for p in LISTED)
            + "; never argv)",
        )
        command.add_argument(
            "--engine",
            choices=sorted(ENGINES),
            default=DEFAULT.name,
            help="with --base-url: the server's engine (how its tokenizer counts, its key's name)",
        )
        if name == "check":
            command.add_argument(
                "--gate", action="append", choices=GATES, help="run only this gate (repeatable)"
            )
        else:
            command.add_argument("--out", help="also write the JSON to this file")
            command.add_argument(
                "--concurrency", default="1,2,4,8", help="streams to measure (default 1,2,4,8)"
            )
            command.add_argument(
                "--contexts",
                default="8K,16K,32K",
                help="prefill sizes in tokens: 8192, 8k (8000) or 8K (8192), as vLLM reads them "
                "(default 8K,16K,32K)",
            )


def _watch_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """logs and events."""
    logs = _api_command(
        sub, "logs", "show a lane's engine log", "Show the engine's log of LANE (journald)."
    )
    logs.add_argument("lane", metavar="LANE")
    logs.add_argument("-n", "--lines", type=int, default=100, help="how many lines (default 100)")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep following (journalctl --follow)"
    )
    events = _api_command(sub, "events", "show lane transitions", "Show recent lane transitions.")
    events.add_argument(
        "-f", "--follow", action="store_true", help="keep following (Server-Sent Events)"
    )
    events.add_argument("--lane", help="only this lane")


def config_path(args: argparse.Namespace) -> str:
    from laned.config.paths import default_config_path

    return str(args.config or default_config_path(os.environ))


def client(args: argparse.Namespace) -> Client:
    from laned.adapters.secret_files import read_token
    from laned.cli.client import Client
    from laned.validation.load import load_config

    url, token_file = args.url, args.token_file
    if url is None or token_file is None:
        try:
            config = load_config(config_path(args))
            url = url or f"http://{config.daemon.listen}"
            token_file = token_file or config.daemon.token_file
        except LanedError:
            url = url or "http://127.0.0.1:9000"
    return Client(url, read_token(token_file) if token_file else None)
