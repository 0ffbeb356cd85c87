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
from laned.cli import args as cli_args
from laned.cli.args import EXIT_FAILED, EXIT_OK, EXIT_USAGE, config_path
from laned.cli.args import client as api_client
from laned.cli.gates import cmd_bench, cmd_check
from laned.cli.setup import cmd_completion, cmd_init, cmd_lanes
from laned.errors import ApiUnavailable, ConfigError, Finding, LanedError, Severity

if TYPE_CHECKING:
    from laned.config.model import Config


def _print_warnings(config_source: str, warnings: Sequence[object]) -> None:
    for problem in warnings:
        print(problem.render(config_source), file=sys.stderr)  # type: ignore[attr-defined]


def cmd_validate(args: argparse.Namespace) -> int:
    """`laned validate`."""
    from laned.validation.load import load_config

    config = load_config(config_path(args))
    _print_warnings(config.source, config.warnings)
    warnings = [w for w in config.warnings if w.severity is Severity.WARNING]
    if args.engine_flags:
        flagged = _engine_flags(config, args.python)
        _print_warnings(config.source, flagged)
        warnings += [w for w in flagged if w.severity is Severity.WARNING]
    lanes = ", ".join(sorted(config.lanes)) or "none"
    suffix = f", {len(warnings)} warning(s)" if warnings else ""
    print(f"{config.source}: valid ({len(config.lanes)} lane(s): {lanes}{suffix})")
    if len(config.lanes) > 1:
        from laned.cli.client import placement_lines
        from laned.engines.footprints import report

        print("\n".join(placement_lines(report(config.lanes, _gpu_totals()))))
    return EXIT_OK


def _gpu_totals() -> dict[int, int] | None:
    """This host's GPUs' memory (NVML, or a simulated host's), None where none is read."""
    from laned.adapters.gpus import Nvml, SimGpus

    simulated = os.environ.get("LANED_SIM_GPUS")
    gpus = SimGpus(simulated) if simulated else Nvml.open()[0]
    if gpus is None:
        return None
    try:
        return {g.index: g.total_bytes for g in gpus.read()} or None
    finally:
        gpus.close()


def _engine_flags(config: Config, python: str | None) -> list[Finding]:
    """Each lane's flags against its engine's own parser (read once per interpreter,
    program or image); what could not be read is a warning too, never a reason to fail."""
    from laned.adapters.engine_parser import read_flags
    from laned.validation import engine_flags

    found: list[Finding] = []
    known: dict[engine_flags.Source, engine_flags.KnownFlags | LanedError] = {}
    for lane, spec in sorted(config.lanes.items()):
        base = f"lanes.{lane}"
        source = engine_flags.source_of(spec, python)
        if source is None:
            print(
                f"{base}: engine flags not checked: no Python or program to ask "
                "(give one: --python PATH)"
            )
            continue
        title = source.profile.title
        if source not in known:
            print(f"{base}: reading {title}'s flags from {source} ...", file=sys.stderr)
            try:
                known[source] = read_flags(source, config.daemon.podman)
            except LanedError as exc:
                known[source] = exc
        flags = known[source]
        if isinstance(flags, LanedError):
            hint = (
                f"is {source.program} there? The lane's command names it"
                if source.program
                else f"give an interpreter with {title}: --python PATH"
                + (f" (or `podman pull {source.image}`)" if source.image else "")
            )
            found.append(
                Finding(base, f"engine flags not checked: {flags.message}", hint, Severity.WARNING)
            )
            continue
        said = engine_flags.unknown_flags(config, lane, flags)
        unknown = sum(p.severity is Severity.WARNING for p in said)
        print(
            f"{base}: {unknown} unknown engine flag(s), {len(said) - unknown} note(s), for "
            f"{title} {flags.version} ({source})"
        )
        found += said
    return found


def cmd_render(args: argparse.Namespace) -> int:
    """`laned render [--check]`."""
    from laned.adapters import rendered
    from laned.adapters.systemd import installed_version
    from laned.render import plan as render
    from laned.validation.load import load_config

    config = load_config(config_path(args))
    _print_warnings(config.source, config.warnings)
    # The unit's restart policy depends on the manager (RestartSteps= since systemd 254).
    version = installed_version() or render.DEFAULT_SYSTEMD_VERSION
    if args.check:
        differences = rendered.differences(config, version)
        for item in differences:
            print(item)
        if differences:
            print(
                f"{len(differences)} difference(s); run `laned render` to rewrite", file=sys.stderr
            )
            return EXIT_FAILED
        print("in sync: every generated file matches the config")
        return EXIT_OK
    changes = rendered.apply(config, version)
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

    from laned.daemon import serve
    from laned.validation.load import load_config

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # httpx logs every request at INFO: a line per probe, every few seconds per lane, for
    # ever, burying the transitions in the journal. Its warnings still show.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    config = load_config(config_path(args))
    _print_warnings(config.source, config.warnings)
    return asyncio.run(serve(config))


def cmd_status(args: argparse.Namespace) -> int:
    """`laned status [--fit] [--json] [--watch [SECONDS]]`."""
    import json
    import time

    from laned.cli.client import fit_table, table

    if args.fit:
        try:
            body = api_client(args).call("GET", "/fit")
        except ApiUnavailable:
            body = _local(args, "fit")
        print(json.dumps(body, indent=2) if args.json else fit_table(body))
        return EXIT_OK
    client = api_client(args)
    # Colour only for a person at a terminal (and never with NO_COLOR, https://no-color.org).
    colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    while True:
        body = client.call("GET", "/lanes")
        shown = json.dumps(body, indent=2) if args.json else table(body["lanes"], colour)
        if not args.json:
            shown += "".join(f"\nlaned: {notice}" for notice in body.get("notices", []))
        if args.watch is None:
            print(shown)
            return EXIT_OK
        print(("\033[H\033[2J" if sys.stdout.isatty() else "\n") + shown, flush=True)
        time.sleep(args.watch)


def _local(args: argparse.Namespace, what: str) -> dict[str, Any]:
    """Preflight or fit computed here from the config and the host alone, for when laned's
    API does not answer: what the daemon knows (which of its lanes holds a port, the image of
    the last good start) is not read behind its back, and the note says so."""
    import asyncio

    from laned.adapters.host import Host
    from laned.adapters.podman import Podman
    from laned.config.names import podman_socket
    from laned.preflight.fit import fit_report
    from laned.preflight.rules import evaluate, report
    from laned.validation.load import load_config

    config = load_config(config_path(args))
    host = Host(Podman(podman_socket(config, os.environ, os.getuid())))
    print(
        "laned does not answer: checking here, from the config and this host alone (which of "
        "its lanes runs is not known; start laned for its own view: "
        "systemctl --user start laned)",
        file=sys.stderr,
    )
    try:
        if what == "fit":
            return fit_report(config.lanes, asyncio.run(host.facts()))
        config.lane(args.lane)  # UnknownLane, naming the configured lanes
        facts = asyncio.run(host.lane_facts(config, args.lane, None, None, lanes_known=False))
        return report(args.lane, evaluate(args.lane, config.lanes[args.lane], facts))
    finally:
        host.close()


def cmd_preflight(args: argparse.Namespace) -> int:
    """`laned preflight LANE [--json]`."""
    import json

    from laned.cli.client import findings_text

    try:
        body = api_client(args).call("GET", f"/lanes/{args.lane}/preflight")
    except ApiUnavailable:
        body = _local(args, "preflight")
    print(json.dumps(body, indent=2) if args.json else findings_text(body))
    return EXIT_OK if body["ok"] else EXIT_FAILED


def cmd_lane(args: argparse.Namespace) -> int:
    """`laned activate|deactivate|restart LANE [--wait]`."""
    from laned.cli.client import follow_start

    client = api_client(args)
    method = "POST"
    force = "true" if getattr(args, "force", False) else None
    view = client.call(method, f"/lanes/{args.lane}/{args.command}", force=force)
    if args.wait and args.command in ("activate", "restart"):
        view = follow_start(client, args.lane, args.timeout)
    elif args.wait:
        view = client.call(
            method,
            f"/lanes/{args.lane}/deactivate",
            wait="true",
            timeout=args.timeout,
            force=force,
        )
    if not args.wait:  # accepted, not done: say so, not only the state it is still in
        print(
            f"{view['name']}: {args.command} accepted; {view['state']} now, desired "
            f"{view.get('desired', '?')} (follow: laned events -f --lane {view['name']}, "
            "or add --wait)"
        )
        return EXIT_OK
    print(
        f"{view['name']}: {view['state']}" + (f" ({view['reason']})" if view.get("reason") else "")
    )
    if args.wait and args.command != "deactivate" and view["state"] != "ready":
        return EXIT_FAILED
    return EXIT_OK


def cmd_reload(args: argparse.Namespace) -> int:
    """`laned reload`: POST /reload (what SIGHUP and `systemctl --user reload laned` do);
    what was applied, deferred or refused. Exit 1 when laned refused it, 2 for a bad config."""
    from laned.config.applied import reload_lines
    from laned.errors import ApiRefused
    from laned.validation.load import load_config

    if args.url is None or args.token_file is None:
        # The file names laned's address and token: a broken one is said here, not sent.
        try:
            load_config(config_path(args))
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            print("laned: not reloaded; the running config stays in force", file=sys.stderr)
            return EXIT_USAGE
    try:
        body = api_client(args).call("POST", "/reload")
    except ApiRefused as exc:
        print(f"laned: not reloaded: {exc}", file=sys.stderr)
        return EXIT_USAGE if exc.code == "bad-config" else EXIT_FAILED
    for line in reload_lines(body["keys"], body["restart_needed"]):
        print(line)
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    """`laned logs LANE [-n N] [-f]`."""
    import os

    client = api_client(args)
    view = client.call("GET", f"/lanes/{args.lane}")
    for line in client.call("GET", f"/lanes/{args.lane}/logs", lines=args.lines)["lines"]:
        print(line, flush=True)
    if args.follow:
        # The API serves a snapshot; following reads the journal itself, on this host.
        unit = view["unit"]
        match = [f"_SYSTEMD_USER_UNIT={unit}", "+", f"_SYSTEMD_UNIT={unit}"]
        os.execvp(
            "journalctl",
            ["journalctl", "--follow", "--lines=0", "--output=short-iso", "--all", *match],
        )
    return EXIT_OK


def cmd_events(args: argparse.Namespace) -> int:
    """`laned events [-f] [--lane LANE]`."""
    import json
    import time

    client = api_client(args)

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

    from laned.cli.install import install
    from laned.validation.load import load_config

    path = config_path(args)
    config = load_config(path)
    for line in asyncio.run(install(config, path)):
        print(line)
    return EXIT_OK


def cmd_import(args: argparse.Namespace) -> int:
    """`laned import [--name LANE] [--set NAME=VALUE]... [--cwd DIR] [FILE | -]`."""
    from laned.errors import CommandLineError
    from laned.importer.toml_out import render_import
    from laned.importer.translate import import_run
    from laned.validation.load import parse_config

    path = args.file or args.source or "-"
    values = dict(item.partition("=")[::2] for item in args.set)
    if path == "-":
        text, source = sys.stdin.read(), "a command line on stdin"
    else:
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError) as exc:
            print(f"laned: cannot read {path}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        source = os.path.basename(path)
    try:
        nodes = [tuple(item.split("=", 1)) for item in args.nodes]
        if any(len(node) != 2 for node in nodes):
            print("laned import: --nodes takes HOST=URL (http(s)://HOST:PORT)", file=sys.stderr)
            return EXIT_USAGE
        cwd = os.path.abspath(os.path.expanduser(args.cwd)) if args.cwd else os.getcwd()
        lane = import_run(text, args.name, values, nodes, cwd)  # type: ignore[arg-type]
    except CommandLineError as exc:
        print(f"laned import: {exc}", file=sys.stderr)
        return EXIT_USAGE
    rendered = render_import(lane, source)
    print(rendered, end="")
    for warning in lane.warnings:
        print(f"laned import: warning: {warning}", file=sys.stderr)
    # What laned validate would say of it, beside a default [daemon].
    # Checked as its head would check it (the other ranks differ only in their values).
    head = f'[daemon]\nhost = "{lane.nodes[0][0]}"\n' if lane.nodes else ""
    config = parse_config(head + rendered, source=f"the imported lane {lane.name}")
    _print_warnings(config.source, config.warnings)
    return EXIT_OK


def cmd_sim(args: argparse.Namespace) -> int:
    """`laned sim ...`: hand over to the simulated engine's own command line."""
    from laned.sim.__main__ import main as sim_main

    return sim_main(list(args.sim_args))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = cli_args.parser()
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
        "reload": cmd_reload,
        "logs": cmd_logs,
        "install": cmd_install,
        "events": cmd_events,
        "import": cmd_import,
        "init": cmd_init,
        "completion": cmd_completion,
        "_lanes": cmd_lanes,
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
