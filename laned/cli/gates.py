"""`laned check` and `laned bench`: the acceptance gates and the benchmark sweep, through
laned (which keeps check results) or straight against the engine."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from laned.adapters.engine_api import EngineClient
from laned.cli.args import EXIT_FAILED, EXIT_OK, config_path
from laned.cli.args import client as api_client
from laned.config.durations import parse_count
from laned.config.model import GATES, ChecksConfig
from laned.errors import ApiUnavailable, EngineRefused, LaneNotRunning, UsageError


def _engine_target(args: argparse.Namespace) -> tuple[EngineClient, ChecksConfig, str]:
    """(EngineClient, the lane's ChecksConfig, label) for a configured lane or --base-url."""
    from laned import engines
    from laned.adapters.engine_api import EngineClient
    from laned.adapters.secret_files import read_api_key
    from laned.config.model import ChecksConfig
    from laned.validation.load import load_config

    if args.base_url:
        if not args.model:
            raise UsageError("--base-url needs --model", "name the model the server serves")
        profile = engines.ENGINES[args.engine]
        key = read_api_key(args.api_key_file, profile.api_key_env) if args.api_key_file else None
        client = EngineClient(args.base_url, args.model, key, profile=profile)
        return client, ChecksConfig(), args.base_url
    if not args.lane:
        raise UsageError("name a LANE (or give --base-url and --model)", "see laned status")
    config = load_config(config_path(args))
    spec = config.lane(args.lane)
    profile = engines.for_lane(spec)
    key = read_api_key(spec.secrets_path, profile.api_key_env)
    client = EngineClient(
        f"http://127.0.0.1:{spec.port}", spec.served_model_name, key, profile=profile
    )
    return client, spec.checks, args.lane


def cmd_check(args: argparse.Namespace) -> int:
    """`laned check LANE [--gate G ...] [--json]`."""
    import asyncio
    import json

    from laned.cli.client import checks_passed, checks_text
    from laned.gates.acceptance import GateResult, run_gates

    gates = args.gate or list(GATES)
    run: dict[str, Any] | None = None
    if not args.base_url:  # a configured lane: through laned, which keeps the results
        if not args.lane:
            raise UsageError("name a LANE (or give --base-url and --model)", "see laned status")
        client = api_client(args)
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

    from laned import engines
    from laned.gates.bench import run_bench, table

    try:
        concurrency = [parse_count(c) for c in args.concurrency.split(",")]
        contexts = [parse_count(c) for c in args.contexts.split(",")]
    except ValueError as exc:
        raise UsageError(
            f"--concurrency {args.concurrency!r} / --contexts {args.contexts!r}: {exc}",
            "e.g. --concurrency 1,2,4,8 --contexts 8K,16K,32K (K = 1024, k = 1000, as vLLM reads them)",
        ) from None
    engine, _settings, label = _engine_target(args)

    async def sweep() -> dict[str, Any]:
        try:
            served = await engine.served()
            if served is None:
                raise LaneNotRunning(
                    f"{engine.base_url} does not serve {engine.model}: is the lane running?",
                    f"laned activate {label} --wait",
                )
            window = int(served.get("max_model_len") or 0)
            if window <= 0:
                raise EngineRefused(
                    f"{engine.base_url}/v1/models gives no window (max_model_len)",
                    "is --engine right for it? ("
                    + ", ".join(p.name for p in engines.LISTED[:-1])
                    + f" or {engines.LISTED[-1].name})",
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
        from laned.adapters.rendered import write_atomic

        write_atomic(args.out, text + "\n", 0o644)
    print(text if args.json else table(result))
    return EXIT_OK
