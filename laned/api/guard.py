"""Who may call: a Host laned expects (DNS rebinding), no browser cross-site request that
changes lanes (Origin / Sec-Fetch-Site), and the bearer token where one is set.

The guard decides on the route that will run, never on the spelling of the path: the door
resolves each request the way the router does (`Routes.resolve`: Starlette's own
`route.matches`, the first full match wins) and the guard reads the access the route
declares (`@access(...)` on its endpoint). A request that resolves to no route, or whose path
holds a control or whitespace character (Starlette's `$` also matches before a trailing
newline: `/activate%0A` would run the activate), is refused before any handler.

Mutating endpoints answer GET too (so `curl :9000/lanes/dsv41/activate` works as people
type it), which is why the route's access decides, not the method.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from pydantic import TypeAdapter, ValidationError
from starlette.datastructures import QueryParams
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import Scope

from laned.api.errors import envelope

LOCAL_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}
CALL = "laned.call"  # where the door leaves the guard's reading of a request, in its scope


class Access(enum.Enum):
    """What a route asks of its caller."""

    PUBLIC = "public"  # the page, /healthz, the OpenAI endpoint (the engine judges its key)
    READ = "read"  # the token when daemon.token_for_reads
    MUTATE = "mutate"  # the token always; never from another site


@dataclass(frozen=True)
class Grant:
    """A route's access, and whether laned's peers may call it with the peer token (for the
    lanes over several hosts only: a rank's activate/deactivate/restart, a rank's view)."""

    access: Access
    peers: bool = False


F = TypeVar("F", bound=Callable[..., Any])


def access(kind: Access, peers: bool = False) -> Callable[[F], F]:
    """Declare an endpoint's access (the guard refuses to serve a route that declares none)."""

    def mark(endpoint: F) -> F:
        endpoint.laned_grant = Grant(kind, peers)  # type: ignore[attr-defined]
        return endpoint

    return mark


# FastAPI's own pages (the schema and its viewers): reads.
SCHEMA_PATHS = ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")


def grant_of(route: BaseRoute) -> Grant:
    """The access `route` declares; LookupError for a route that declares none."""
    endpoint = getattr(route, "endpoint", None)
    grant = getattr(endpoint, "laned_grant", None)
    if isinstance(grant, Grant):
        return grant
    if getattr(route, "path", None) in SCHEMA_PATHS:
        return Grant(Access.READ)
    raise LookupError(
        f"route {getattr(route, 'path', route)!r} declares no access (laned.api.guard.access)"
    )


@dataclass(frozen=True)
class Call:
    """The guard's reading of one request: the route it resolves to (the door picks its fast
    paths by it) and `rank_only` as the handler will use it (parsed once, here)."""

    route: BaseRoute
    rank_only: bool
    # Whether the caller may read laned's own state: no token_for_reads, or laned's token
    # given. A public route that also tells laned's state (GET /v1/models: its lanes and
    # their states) tells it only then.
    reads: bool = True

    @staticmethod
    def of(scope: Scope) -> Call:
        """The door's reading of this request (every request passes the door)."""
        call = scope.get(CALL)
        if not isinstance(call, Call):
            raise RuntimeError("the request did not pass laned's door")
        return call


# Whitespace and control characters (C0, DEL, C1) anywhere in the decoded path.
UNSAFE_PATH = re.compile(r"[\s\x00-\x1f\x7f-\x9f]")
BOOL = TypeAdapter(bool)  # how FastAPI reads a `bool` query parameter (pydantic, lax)


class Routes:
    """The application's routes, resolved as Starlette's router resolves them; the answers
    for a method and path are kept (a path names at most a lane)."""

    KEEP = 4096

    def __init__(self, routes: Sequence[BaseRoute]) -> None:
        self.routes = list(routes)
        self.grants = {id(route): grant_of(route) for route in self.routes}  # every one declares
        self._seen: dict[tuple[str, str], tuple[BaseRoute, str | None] | int] = {}

    def resolve(self, scope: Scope) -> tuple[BaseRoute, str | None] | int:
        """(the route that will run, the lane it names), or the status that refuses the
        request: 404 for no route, 405 for a route of another method."""
        key = (scope["method"], scope["path"])
        found = self._seen.get(key)
        if found is None:
            found = self._resolve(scope)
            if len(self._seen) >= self.KEEP:
                self._seen.clear()
            self._seen[key] = found
        return found

    def _resolve(self, scope: Scope) -> tuple[BaseRoute, str | None] | int:
        partial = None
        probe = {
            "type": "http",
            "path": scope["path"],
            "method": scope["method"],
            "root_path": scope.get("root_path", ""),
        }
        for route in self.routes:
            match, child = route.matches(probe)
            if match is Match.FULL:
                lane = child.get("path_params", {}).get("lane")
                return route, lane if isinstance(lane, str) else None
            if match is Match.PARTIAL and partial is None:
                partial = route
        return 405 if partial is not None else 404


@dataclass(frozen=True)
class ApiSettings:
    """What the API needs besides the supervisor."""

    listen_host: str
    listen_port: int
    token: str | None = None
    token_for_reads: bool = False  # also /lanes, /metrics, /sd, /events ... (not /healthz)
    peer_token: str | None = None  # lanes over several hosts: what the other hosts' laned send
    peer_hosts: frozenset[str] = frozenset()  # their names for this host, as Host headers
    peer_lanes: frozenset[str] = frozenset()  # the lanes over several hosts (the peer token's)


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


WATCHED = frozenset((b"host", b"origin", b"sec-fetch-site", b"authorization"))
READING_METHODS = frozenset(("GET", "HEAD"))


class Guard:
    """Who may call, judged from the request as the server hands it over (laned.api.door
    asks before anything else runs): the raw headers are read once, no Request is built."""

    def __init__(self, settings: ApiSettings, routes: Routes) -> None:
        self.settings, self.routes = settings, routes
        self.allowed = (
            LOCAL_NAMES
            | {settings.listen_host.lower(), f"[{settings.listen_host.lower()}]"}
            | settings.peer_hosts
        )

    def refusal(self, scope: Scope) -> Response | None:
        """The answer that refuses the request, or None when it may go on (the guard's
        reading of it, `Call`, is then in the scope for the handler)."""
        settings, allowed, path = self.settings, self.allowed, scope["path"]
        seen: dict[bytes, str] = {}
        for name, value in scope["headers"]:
            if name in WATCHED and name not in seen:  # the first of each, as Starlette reads
                seen[name] = value.decode("latin-1")
        if host_of(seen.get(b"host", "")) not in allowed:
            return envelope(
                403,
                "forbidden-host",
                f"Host {seen.get(b'host', '')!r} is not laned's",
                f"use http://127.0.0.1:{settings.listen_port} or the configured listen address",
            )
        if UNSAFE_PATH.search(path):
            return envelope(
                400,
                "bad-path",
                f"the path {path!r} holds a control or whitespace character",
                "send the path as the endpoint spells it (see /docs)",
            )
        resolved = self.routes.resolve(scope)
        if isinstance(resolved, int):
            return _no_route(resolved, scope["method"], path)
        route, lane = resolved
        grant = self.routes.grants[id(route)]
        rank_only = _flag(scope.get("query_string", b""), "rank_only")
        if rank_only is None:
            return envelope(
                400,
                "bad-request",
                "rank_only: not a boolean",
                "rank_only=true is for laned's peers; leave it out otherwise",
            )
        mutating = grant.access is Access.MUTATE or scope["method"] not in READING_METHODS
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
        # The peer token opens only what peers need, for the lanes over several hosts.
        peer_may = peer and grant.peers and lane in settings.peer_lanes
        if rank_only and not peer_may:
            return envelope(
                403,
                "forbidden",
                "rank_only is for laned's peers: it needs the peer token, on a lane over "
                "several hosts",
                "ask for the whole lane (without rank_only); its head coordinates the ranks",
            )
        needs_token = settings.token is not None and (
            grant.access is Access.MUTATE
            or (grant.access is Access.READ and settings.token_for_reads)
        )
        if needs_token and not peer_may:
            assert settings.token is not None
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
                    "the peer token does not open this endpoint"
                    if peer
                    else "the bearer token is wrong",
                    "use the token in daemon.token_file",
                )
        reads = not (settings.token is not None and settings.token_for_reads) or (
            # Compared only where reads are guarded: without token_for_reads no request pays.
            needs_token or same_secret(given, f"Bearer {settings.token}")
        )
        scope[CALL] = Call(route, rank_only, reads)
        return None


def _no_route(status: int, method: str, path: str) -> Response:
    if status == 405:
        return envelope(
            405,
            "method-not-allowed",
            f"{method} is not allowed on {path}",
            "see /docs for the endpoints and their methods",
        )
    return envelope(404, "not-found", f"no endpoint {path}", "see /docs for the endpoints")


def _flag(query: bytes, name: str) -> bool | None:
    """A boolean query parameter as the handler reads it (Starlette's query parsing, its last
    value; pydantic's reading of a bool): False when absent, None when it is no boolean."""
    if not query:
        return False
    value = QueryParams(query.decode("latin-1")).get(name)
    if value is None:
        return False
    try:
        return BOOL.validate_python(value)
    except ValidationError:
        return None
