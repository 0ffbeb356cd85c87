"""laned's listener: its address (`daemon.listen`, read as HOST:PORT) and `[daemon.limits]`, what
one request may send it, how long it may take, and how many connections may be open
(laned.api.limits applies them; docs/configuration.md)."""

from __future__ import annotations

import re

from pydantic import ConfigDict, Field

from laned.config.base import Duration, StrictModel

# Each byte of a request's body counts this many bytes against daemon.limits.request_memory_mib:
# the body held until it has gone to the engine, and one copy on the way (asyncio's write
# buffer to the engine, or the pipe to the body parser's worker; bench/request_budget.py).
BODY_COPIES = 2


class LimitsConfig(StrictModel):
    """Bounded input at every listener; the defaults fit a 512K-token prompt (as token ids,
    up to 8 bytes a token in JSON: 4 MiB) four times over."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    max_body_mib: float = Field(default=16.0, gt=0)  # one request's body
    max_header_kib: float = Field(default=64.0, gt=0)  # its request line and headers
    head_timeout: Duration = 10.0  # from the connection (or its last answer) to a whole head
    body_timeout: Duration = 120.0  # from the head to the whole body
    max_connections: int = Field(default=4096, ge=16)  # in all (kept below the fd limit)
    max_connections_per_client: int = Field(default=1024, ge=1)  # from one client
    # The memory of every request in flight together (their bodies and the copies made on
    # the way to the engine): unset, a 32nd of the host's memory, 256 MiB to 2 GiB
    # (laned.api.budget). A request that finds no room waits this long, then gets 503.
    request_memory_mib: float | None = Field(default=None, gt=0)
    request_memory_wait: Duration = 5.0


def parse_listen(listen: str) -> tuple[str, int] | None:
    """Split "host:port" / "[v6]:port" into (host, port); None when malformed."""
    match = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:(\d{1,5})|([A-Za-z0-9.-]+):(\d{1,5})", listen)
    if not match:
        return None
    host = match.group(1) or match.group(3)
    port = int(match.group(2) or match.group(4))
    return (host, port) if 0 < port < 65536 else None


def api_address(listen: str) -> str:
    """Where a command on this host reaches laned's API, for hints (`curl -s ADDRESS/...`):
    `localhost:PORT` for a loopback or wildcard listen, else the host as configured."""
    parsed = parse_listen(listen)
    if parsed is None:
        return listen
    host, port = parsed
    if host in ("0.0.0.0", "::", "localhost") or host.startswith("127.") or host == "::1":
        return f"localhost:{port}"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
