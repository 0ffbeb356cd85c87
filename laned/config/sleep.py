"""The rules of a lane that sleeps instead of stopping (`sleep_level` 1 or 2, docs/sleep.md),
whatever its engine (each engine's own rules are its profile's, laned.engines: vLLM's dev
mode and loopback, the levels SGLang and llama.cpp take). A sleeping engine keeps its process, so it
keeps its port and its residual GPU memory: no peer of its group may share the port. A lane
over several hosts sleeps where its engine's head sleeps every rank (laned.validation.rules).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

from laned.config.groups import port_sharers
from laned.config.model import Config
from laned.errors import Finding, Severity

LOOPBACK = "127.0.0.1"


def loopback(host: str) -> bool:
    """Whether a host name or address only reaches this machine ([::1] bracketed or not)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_sleep(config: Config) -> Iterator[Finding]:
    """Every problem of the lanes that sleep."""
    for name, spec in config.lanes.items():
        if not spec.sleep_level:
            if spec.dev_mode_exposed:
                yield Finding(
                    f"lanes.{name}.dev_mode_exposed",
                    "is set but the lane does not sleep (sleep_level = 0): laned does not "
                    "turn dev mode on for it",
                    "remove it, or set sleep_level",
                    severity=Severity.WARNING,
                )
            continue
        base = f"lanes.{name}"
        if spec.container is not None and spec.container.network != "host":
            yield Finding(
                f"{base}.container.network",
                "a container lane that sleeps listens on the host's loopback: it needs the "
                "host's network",
                f'set {base}.container.network = "host", or sleep_level = 0',
            )
        for peer in port_sharers(config, name):
            yield Finding(
                f"{base}.port",
                f"lane {peer} has the same port {spec.port}, which {name} keeps while it sleeps",
                "give each lane its own port",
            )
