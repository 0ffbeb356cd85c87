"""Who may call: a Host laned expects (DNS rebinding), no browser cross-site request that
changes lanes (Origin / Sec-Fetch-Site), and the bearer token where one is set.

Mutating endpoints answer GET too (so `curl :9000/lanes/dsv41/activate` works as people
type it), which is why these checks look at the path and not only the method.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from fastapi.responses import Response
from starlette.types import Scope

from laned.api.errors import envelope

LOCAL_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}
MUTATING_SUFFIXES = ("/activate", "/deactivate", "/restart")


@dataclass(frozen=True)
class ApiSettings:
    """What the API needs besides the supervisor."""

    listen_host: str
    listen_port: int
    token: str | None = None
    token_for_reads: bool = False  # also /lanes, /metrics, /sd, /events ... (not /healthz)
    peer_token: str | None = None  # lanes over several hosts: what the other hosts' laned send
    peer_hosts: frozenset[str] = frozenset()  # their names for this host, as Host headers


def same_secret(given: str, expected: str) -> bool:
    """Whether `given` is `expected`, in a time that tells nothing of either: compare_digest
    takes the same time for any two values of one length, and comparing SHA-256 digests
    makes every length one (compare_digest on the raw values would tell the token's length).
    bench/token_timing.py measures it."""
    digest = hashlib.sha256
    return hmac.compare_digest(digest(given.encode()).digest(), digest(expected.encode()).digest())


def host_of(value: str) -> str:
    """The host part of a Host header or netloc, lowercased ([::1] kept bracketed)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class Guard:
    """Who may call, judged from the request as the server hands it over (laned.api.door
    asks before anything else runs): the raw headers are read once, no Request is built."""

    def __init__(self, settings: ApiSettings) -> None:
        self.settings = settings
        self.allowed = (
            LOCAL_NAMES
            | {settings.listen_host.lower(), f"[{settings.listen_host.lower()}]"}
            | settings.peer_hosts
        )

    def refusal(self, scope: Scope) -> Response | None:
        """The answer that refuses the request, or None when it may go on."""
        settings, allowed = self.settings, self.allowed
        seen: dict[bytes, str] = {}
        for name, value in scope["headers"]:
            if name in WATCHED and name not in seen:  # the first of each, as Starlette reads
                seen[name] = value.decode("latin-1")
        path = scope["path"]
        if host_of(seen.get(b"host", "")) not in allowed:
            return envelope(
                403,
                "forbidden-host",
                f"Host {seen.get(b'host', '')!r} is not laned's",
                f"use http://127.0.0.1:{settings.listen_port} or the configured listen address",
            )
        mutating = scope["method"] == "POST" or path.endswith(MUTATING_SUFFIXES)
        if mutating:
            site = seen.get(b"sec-fetch-site")
            origin = seen.get(b"origin")
            origin_host = host_of(urlsplit(origin).netloc) if origin else None
            if (site is not None and site not in ("same-origin", "none")) or (
                origin_host is not None and origin_host not in allowed
            ):
                return envelope(
                    403,
                    "cross-site",
                    "cross-site requests may not change lanes",
                    "use curl or the laned CLI",
                )
        given = seen.get(b"authorization", "")
        peer = settings.peer_token is not None and same_secret(
            given, f"Bearer {settings.peer_token}"
        )
        if _rank_only(scope.get("query_string", b"")) and not peer:
            return envelope(
                403,
                "forbidden",
                "rank_only is for laned's peers: it needs the peer token",
                "ask for the whole lane (without rank_only); its head coordinates the ranks",
            )
        if peer:
            return None
        # The OpenAI endpoint's Authorization is the lane's API key, for the engine to judge:
        # laned's token is not asked for there (the Host and cross-site checks still hold).
        openai = path.startswith("/v1/")
        if (
            settings.token is not None
            and not openai
            # The page itself holds no data (it asks for the token when /lanes wants one).
            and (mutating or (settings.token_for_reads and path not in ("/healthz", "/")))
        ):
            if not given:
                return envelope(
                    401,
                    "unauthorized",
                    "this endpoint needs a bearer token",
                    "send Authorization: Bearer <token from daemon.token_file>",
                )
            if not same_secret(given, f"Bearer {settings.token}"):
                return envelope(
                    403,
                    "forbidden",
                    "the bearer token is wrong",
                    "use the token in daemon.token_file",
                )
        return None


WATCHED = frozenset((b"host", b"origin", b"sec-fetch-site", b"authorization"))


def _rank_only(query: bytes) -> bool:
    """Whether the query asks for rank_only (its last value, as Starlette reads it)."""
    if b"rank_only" not in query:
        return False
    values = [v for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True) if k == "rank_only"]  # fmt: skip
    return bool(values) and values[-1].lower() in ("true", "1")
