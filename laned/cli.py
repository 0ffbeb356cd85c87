"""The `laned` command line. The only place that turns errors into exit codes.

Exit codes: 0 ok, 1 the operation failed (or, with --check, files differ), 2 bad usage
or a bad config.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from laned import __version__
from laned.config import GATES
from laned.errors import ConfigError, LanedError, Severity

if TYPE_CHECKING:
    from laned.client import Client
    from laned.config import ChecksConfig, Config
    from laned.engine_api import EngineClient

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="laned",
        description="laned owns the GPU inference lanes of this host as systemd user units.",
        epilog="Config: --config PATH, else $LANED_CONFIG, else $XDG_CONFIG_HOME/laned/laned.toml.",
    )
    parser.add_argument("--config", metavar="PATH", help="the laned.toml to use")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    sub.add_parser(
        "validate",
        help="check the config and report every problem",
        description="Check the config; print every error and warning with its key path. "
        "Exit 0 when it is valid, 2 when it is not.",
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
        "(or daemon.default_lane) and supervise until SIGTERM. The lanes keep running when laned stops.",
    )

    sub.add_parser(
        "install",
        help="install laned.service (enabled, started)",
        description="Write laned's own unit to unit_dir, reload systemd, enable it (default.target) and "
        "(re)start it, so laned comes up at boot and restores the lane that should run.",
    )

    def api_command(name: str, help_text: str, description: str) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=help_text, description=description)
        command.add_argument("--url", help="laned's API (default: http:// + daemon.listen)")
        command.add_argument(
            "--token-file", help="file with the API token (default: daemon.token_file)"
        )
        return command

    status = api_command("status", "show every lane", "Show every lane's state from laned's API.")
    status.add_argument("--json", action="store_true", help="print the API's JSON")
    status.add_argument(
        "--fit",
        action="store_true",
        help="which configured lanes this host can run at all (their needs against its GPUs, memory, disk)",
    )
    preflight = api_command(
        "preflight",
        "check that LANE would start",
        "Run LANE's preflight checks (image, model and mount paths, API key file, port, needs, "
        "engine timeouts, sampling, compile cache, image drift) through laned's API, or here "
        "when laned is not running. Exit 1 when a check fails.",
    )
    preflight.add_argument("lane", metavar="LANE")
    preflight.add_argument("--json", action="store_true", help="print the findings as JSON")
    for name, verb in (("activate", "make LANE the running lane of its group"),
                       ("deactivate", "stop LANE"), ("restart", "stop and start LANE again")):  # fmt: skip
        command = api_command(name, verb, f"{verb[0].upper()}{verb[1:]} through laned's API.")
        command.add_argument("lane", metavar="LANE")
        command.add_argument(
            "--wait", action="store_true", help="follow it until it is done, with a progress line"
        )
        command.add_argument("--timeout", type=float, help="seconds to wait at most (with --wait)")
        if name == "activate":
            command.add_argument(
                "--force", action="store_true", help="start even when preflight finds errors"
            )
    for name, what in (
        ("check", "run the acceptance gates against LANE"),
        ("bench", "measure LANE: decode by concurrency, prefill by context length"),
    ):
        command = api_command(
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
            "--api-key-file", help="with --base-url: a file with VLLM_API_KEY=... (never argv)"
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
                "--contexts", default="8192,16384,32768", help="prefill sizes (default 8k,16k,32k)"
            )
    logs = api_command(
        "logs", "show a lane's engine log", "Show the engine's log of LANE (journald)."
    )
    logs.add_argument("lane", metavar="LANE")
    logs.add_argument("-n", "--lines", type=int, default=100, help="how many lines (default 100)")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep following (journalctl --follow)"
    )
    events = api_command("events", "show lane transitions", "Show recent lane transitions.")
    events.add_argument(
        "-f", "--follow", action="store_true", help="keep following (Server-Sent Events)"
    )
    events.add_argument("--lane", help="only this lane")
    sim = sub.add_parser(
        "sim",
        help="run the simulated vLLM engine",
        description="The vLLM-compatible simulated engine: `laned sim serve MODEL [vLLM flags]`.",
        add_help=False,
    )
    sim.add_argument("sim_args", nargs=argparse.REMAINDER)
    return parser


def _config_path(args: argparse.Namespace) -> str:
    from laned.paths import default_config_path

    return str(args.config or default_config_path(os.environ))


def _print_warnings(config_source: str, warnings: Sequence[object]) -> None:
    for problem in warnings:
        print(problem.render(config_source), file=sys.stderr)  # type: ignore[attr-defined]


def cmd_validate(args: argparse.Namespace) -> int:
    """`laned validate`."""
    from laned.config import load_config

    config = load_config(_config_path(args))
    _print_warnings(config.source, config.warnings)
    warnings = [w for w in config.warnings if w.severity is Severity.WARNING]
    lanes = ", ".join(sorted(config.lanes)) or "none"
    suffix = f", {len(warnings)} warning(s)" if warnings else ""
    print(f"{config.source}: valid ({len(config.lanes)} lane(s): {lanes}{suffix})")
    return EXIT_OK


def cmd_render(args: argparse.Namespace) -> int:
    """`laned render [--check]`."""
    from laned import render
    from laned.config import load_config
    from laned.systemd import installed_version

    config = load_config(_config_path(args))
    _print_warnings(config.source, config.warnings)
    # The unit's restart policy depends on the manager (RestartSteps= since systemd 254).
    version = installed_version() or render.DEFAULT_SYSTEMD_VERSION
    if args.check:
        differences = render.check(config, version)
        for item in differences:
            print(item)
        if differences:
            print(
                f"{len(differences)} difference(s); run `laned render` to rewrite", file=sys.stderr
            )
            return EXIT_FAILED
        print("in sync: every generated file matches the config")
        return EXIT_OK
    changes = render.apply(config, version)
    changed = [(a, p) for a, p in changes if a is not render.Action.UNCHANGED]
    for action, path in changed:
        print(f"{action.value:9} {path}")
    if not changed:
        print(f"unchanged: {len(changes)} file(s) already match the config")
    elif any(p.endswith(".service") for _, p in changed):
        print(
            "units changed: run `systemctl --user daemon-reload` (laned does this itself when it runs)"
        )
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    """`laned serve`."""
    import asyncio
    import logging

    from laned.config import load_config
    from laned.daemon import serve

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # httpx logs every request at INFO: a line per probe, every few seconds per lane, for
    # ever, burying the transitions in the journal. Its warnings still show.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    config = load_config(_config_path(args))
    _print_warnings(config.source, config.warnings)
    return asyncio.run(serve(config))


def _client(args: argparse.Namespace) -> Client:
    from laned.client import Client
    from laned.config import load_config
    from laned.daemon import read_token

    url, token_file = args.url, args.token_file
    if url is None or token_file is None:
        try:
            config = load_config(_config_path(args))
            url = url or f"http://{config.daemon.listen}"
            token_file = token_file or config.daemon.token_file
        except LanedError:
            url = url or "http://127.0.0.1:9000"
    return Client(url, read_token(token_file) if token_file else None)


def cmd_status(args: argparse.Namespace) -> int:
    """`laned status [--fit]`."""
    import json

    from laned.client import ApiUnavailable, fit_table, table

    if args.fit:
        try:
            body = _client(args).call("GET", "/fit")
        except ApiUnavailable:
            body = _local(args, "fit")
        print(json.dumps(body, indent=2) if args.json else fit_table(body))
        return EXIT_OK
    client = _client(args)
    body = client.call("GET", "/lanes")
    print(json.dumps(body, indent=2) if args.json else table(body["lanes"]))
    return EXIT_OK


def _local(args: argparse.Namespace, what: str) -> dict[str, Any]:
    """Preflight or fit computed here, for when laned's API does not answer."""
    import asyncio

    from laned import state
    from laned.config import load_config
    from laned.host import Host
    from laned.names import podman_socket
    from laned.podman import Podman
    from laned.preflight import fit_report, report

    config = load_config(_config_path(args))
    host = Host(Podman(podman_socket(config, os.environ)))
    print("laned does not answer: checking here, from the config", file=sys.stderr)
    try:
        if what == "fit":
            return fit_report(config.lanes, asyncio.run(host.facts()))
        config.lane(args.lane)  # UnknownLane, naming the configured lanes
        peer = asyncio.run(_running_on_port(config, args.lane))
        last_image = state.load(config.daemon.state_dir).image_ids.get(args.lane)
        return report(args.lane, asyncio.run(host.preflight(config, args.lane, peer, last_image)))
    finally:
        host.close()


async def _running_on_port(config: Config, lane: str) -> str | None:
    """The lane (itself or a group peer on its port) whose unit runs, asked of systemd."""
    from laned.names import unit_name
    from laned.systemd import Systemd

    spec = config.lanes[lane]
    candidates = [lane] + [
        n
        for n, other in sorted(config.lanes.items())
        if n != lane and other.group == spec.group and other.port == spec.port
    ]
    systemd = Systemd()
    try:
        await systemd.connect()
        for name in candidates:
            if (await systemd.snapshot(unit_name(name, config.lanes[name]))).running:
                return name
    except LanedError:
        return None  # no user manager to ask: a held port then counts as a stranger's
    finally:
        systemd.disconnect()
    return None


def cmd_preflight(args: argparse.Namespace) -> int:
    """`laned preflight LANE [--json]`."""
    import json

    from laned.client import ApiUnavailable, findings_text

    try:
        body = _client(args).call("GET", f"/lanes/{args.lane}/preflight")
    except ApiUnavailable:
        body = _local(args, "preflight")
    print(json.dumps(body, indent=2) if args.json else findings_text(body))
    return EXIT_OK if body["ok"] else EXIT_FAILED


def cmd_lane(args: argparse.Namespace) -> int:
    """`laned activate|deactivate|restart LANE [--wait]`."""
    from laned.client import follow_start

    client = _client(args)
    method = "POST"
    force = "true" if getattr(args, "force", False) else None
    view = client.call(method, f"/lanes/{args.lane}/{args.command}", force=force)
    if args.wait and args.command in ("activate", "restart"):
        view = follow_start(client, args.lane, args.timeout)
    elif args.wait:
        view = client.call(
            method, f"/lanes/{args.lane}/deactivate", wait="true", timeout=args.timeout
        )
    print(
        f"{view['name']}: {view['state']}" + (f" ({view['reason']})" if view.get("reason") else "")
    )
    if args.wait and args.command != "deactivate" and view["state"] != "ready":
        return EXIT_FAILED
    return EXIT_OK


def _engine_target(args: argparse.Namespace) -> tuple[EngineClient, ChecksConfig, str]:
    """(EngineClient, the lane's ChecksConfig, label) for a configured lane or --base-url."""
    from laned.config import ChecksConfig, load_config
    from laned.engine_api import EngineClient
    from laned.probes import read_api_key

    if args.base_url:
        if not args.model:
            raise LanedError("--base-url needs --model", "name the model the server serves")
        key = read_api_key(args.api_key_file) if args.api_key_file else None
        return EngineClient(args.base_url, args.model, key), ChecksConfig(), args.base_url
    if not args.lane:
        raise LanedError("name a LANE (or give --base-url and --model)", "see laned status")
    config = load_config(_config_path(args))
    spec = config.lane(args.lane)
    client = EngineClient(
        f"http://127.0.0.1:{spec.port}", spec.served_model_name, read_api_key(spec.api_key_file)
    )
    return client, spec.checks, args.lane


def cmd_check(args: argparse.Namespace) -> int:
    """`laned check LANE [--gate G ...] [--json]`."""
    import asyncio
    import json

    from laned.acceptance import GateResult, run_gates
    from laned.client import ApiUnavailable, checks_passed, checks_text

    gates = args.gate or list(GATES)
    run: dict[str, Any] | None = None
    if not args.base_url:  # a configured lane: through laned, which keeps the results
        if not args.lane:
            raise LanedError("name a LANE (or give --base-url and --model)", "see laned status")
        client = _client(args)
        client.http.timeout = None  # type: ignore[assignment]  # a context gate takes minutes
        try:
            run = client.call("POST", f"/lanes/{args.lane}/check", gate=gates)
        except ApiUnavailable:
            print(
                "laned does not answer: checking here (the results are not kept)", file=sys.stderr
            )
    if run is None:
        engine, settings, label = _engine_target(args)

        async def local() -> list[GateResult]:
            try:
                return await run_gates(engine, settings, gates)
            finally:
                await engine.close()

        results = asyncio.run(local())
        gates_json = {r.gate: r.to_json() for r in results}
        run = {"lane": label, "passed": all(r.passed for r in results), "gates": gates_json}
    print(json.dumps(run, indent=2) if args.json else checks_text(run))
    return EXIT_OK if checks_passed(run) else EXIT_FAILED


def cmd_bench(args: argparse.Namespace) -> int:
    """`laned bench LANE [--json] [--out FILE]`."""
    import asyncio
    import json
    import time

    from laned.benchmark import run_bench, table

    try:
        concurrency = [int(c) for c in args.concurrency.split(",")]
        contexts = [int(c) for c in args.contexts.split(",")]
    except ValueError:
        raise LanedError(
            f"--concurrency {args.concurrency!r} / --contexts {args.contexts!r}: not numbers",
            "e.g. --concurrency 1,2,4,8 --contexts 8192,16384,32768",
        ) from None
    engine, _settings, label = _engine_target(args)

    async def sweep() -> dict[str, Any]:
        try:
            served = await engine.served()
            if served is None:
                raise LanedError(
                    f"{engine.base_url} does not serve {engine.model}: is the lane running?",
                    f"laned activate {label} --wait",
                )
            window = int(served.get("max_model_len") or 0)
            if window <= 0:
                raise LanedError(
                    f"{engine.base_url}/v1/models gives no max_model_len", "is it a vLLM server?"
                )
            return await run_bench(
                engine,
                window,
                concurrency,
                contexts,
                lambda line: print(f"bench: {line}", file=sys.stderr, flush=True),
            )
        finally:
            await engine.close()

    result = {"lane": label, "at": time.time(), **asyncio.run(sweep())}
    text = json.dumps(result, indent=2)
    if args.out:
        from laned.render import write_atomic

        write_atomic(args.out, text + "\n", 0o644)
    print(text if args.json else table(result))
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    """`laned logs LANE [-n N] [-f]`."""
    import os

    client = _client(args)
    view = client.call("GET", f"/lanes/{args.lane}")
    for line in client.call("GET", f"/lanes/{args.lane}/logs", lines=args.lines)["lines"]:
        print(line, flush=True)
    if args.follow:
        # The API serves a snapshot; following reads the journal itself, on this host.
        unit = view["unit"]
        match = [f"_SYSTEMD_USER_UNIT={unit}", "+", f"_SYSTEMD_UNIT={unit}"]
        os.execvp(
            "journalctl", ["journalctl", "--follow", "--lines=0", "--output=short-iso", *match]
        )
    return EXIT_OK


def cmd_events(args: argparse.Namespace) -> int:
    """`laned events [-f] [--lane LANE]`."""
    import json
    import time

    client = _client(args)

    def show(event: dict[str, Any]) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(event["at"])))
        if event.get("kind", "transition") != "transition":  # a note: no state changed
            print(f"{stamp}  {event['lane']} [{event['kind']}] {event['reason']}", flush=True)
            return
        print(
            f"{stamp}  {event['lane']}: {event['from']} -> {event['to']}  ({event['reason']})",
            flush=True,
        )

    if not args.follow:
        for event in client.call("GET", "/events", lane=args.lane)["events"]:
            show(event)
        return EXIT_OK
    params = {"follow": "true", **({"lane": args.lane} if args.lane else {})}
    with client.http.stream("GET", "/events", params=params, timeout=None) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                show(json.loads(line[6:]))
    return EXIT_OK


def cmd_install(args: argparse.Namespace) -> int:
    """`laned install`."""
    import asyncio

    from laned.config import load_config
    from laned.install import install

    path = _config_path(args)
    config = load_config(path)
    for line in asyncio.run(install(config, path)):
        print(line)
    return EXIT_OK


def cmd_sim(args: argparse.Namespace) -> int:
    """`laned sim ...`: hand over to the simulated engine's own command line."""
    from laned.sim.__main__ import main as sim_main

    return sim_main(list(args.sim_args))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad usage, 0 on --help
        return int(exc.code or 0)
    handlers = {
        "validate": cmd_validate,
        "render": cmd_render,
        "sim": cmd_sim,
        "serve": cmd_serve,
        "status": cmd_status,
        "preflight": cmd_preflight,
        "check": cmd_check,
        "bench": cmd_bench,
        "activate": cmd_lane,
        "deactivate": cmd_lane,
        "restart": cmd_lane,
        "logs": cmd_logs,
        "install": cmd_install,
        "events": cmd_events,
    }
    if args.command == "version":
        print(f"laned {__version__}")
        return EXIT_OK
    try:
        return handlers[args.command](args)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    except LanedError as exc:
        print(f"laned: {exc}", file=sys.stderr)
        for finding in getattr(exc, "findings", []):
            print(f"  {finding['severity']}: {finding['message']}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
