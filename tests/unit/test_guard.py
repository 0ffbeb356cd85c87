"""The API guard: its token comparison, whose time must not tell the token
(bench/token_timing.py measures it; here, that every comparison is of two values of one
length, whatever was sent), and who may call, judged from the raw request as the server hands
it over, resolved to the route that will run: every route of the app declares its access,
and no spelling of a mutating path, nor of its query, gets past without the token."""

from __future__ import annotations

import asyncio
import hmac
import json
from typing import Any, ClassVar
from urllib.parse import unquote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laned.api import create_app, guard
from laned.api.guard import Access, ApiSettings, Grant, Guard, Routes


def test_tokens_are_compared_as_digests_of_one_length(monkeypatch: pytest.MonkeyPatch) -> None:
    lengths: list[tuple[int, int]] = []
    compare = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        lengths.append((len(a), len(b)))
        return compare(a, b)

    monkeypatch.setattr(guard.hmac, "compare_digest", spy)
    secret = "Bearer s3cret-token-of-43-characters-xxxxxxxxxx"
    assert guard.same_secret(secret, secret)
    for sent in ("", "Bearer", secret[:-1], secret + "x", "x" + secret[1:], secret * 3):
        assert not guard.same_secret(sent, secret), sent
    assert lengths and all(pair == (32, 32) for pair in lengths), lengths


class Untouchable:
    """A front that records every call made of it: the guard must let none through."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.traffic = None
        self.statuses: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            raise RuntimeError(f"the front was reached: {name}")

        return call


FRONT = Untouchable()
APP = create_app(FRONT, ApiSettings("127.0.0.1", 9000, token="t0k"))  # type: ignore[arg-type]
ROUTES = Routes(APP.routes)
SETTINGS = ApiSettings(
    "127.0.0.1", 9000, token="t0k", token_for_reads=True, peer_token="p33r",
    peer_lanes=frozenset({"pair"}),
)  # fmt: skip
GUARD = Guard(SETTINGS, ROUTES)
HOST = ("Host", "127.0.0.1:9000")
PEER = ("Authorization", "Bearer p33r")
TOKEN = ("Authorization", "Bearer t0k")

# Every route of the app, the door's fast paths among them, with the access it declares.
EXPECTED = {
    ("GET", "/"): Grant(Access.PUBLIC),
    ("GET", "/healthz"): Grant(Access.PUBLIC),
    ("GET", "/v1/models"): Grant(Access.PUBLIC),
    ("POST", "/v1/{path:path}"): Grant(Access.PUBLIC),  # the door's: to the proxy
    ("GET", "/lanes"): Grant(Access.READ),  # the door's
    ("GET", "/metrics"): Grant(Access.READ),  # the door's
    ("GET", "/lanes/{lane}"): Grant(Access.READ, peers=True),
    ("GET", "/lanes/{lane}/preflight"): Grant(Access.READ),
    ("GET", "/lanes/{lane}/logs"): Grant(Access.READ),
    ("GET", "/fit"): Grant(Access.READ),
    ("GET", "/gpus"): Grant(Access.READ),
    ("GET", "/weights"): Grant(Access.READ),
    ("GET", "/timeline"): Grant(Access.READ),
    ("GET", "/sd"): Grant(Access.READ),
    ("GET", "/events"): Grant(Access.READ),
    ("GET", "/openapi.json"): Grant(Access.READ),
    ("GET", "/docs"): Grant(Access.READ),
    ("GET", "/docs/oauth2-redirect"): Grant(Access.READ),
    ("GET", "/redoc"): Grant(Access.READ),
    ("POST", "/lanes/{lane}/check"): Grant(Access.MUTATE),
    ("POST", "/reload"): Grant(Access.MUTATE),
    **{
        (method, f"/lanes/{{lane}}/{action}"): Grant(Access.MUTATE, peers=True)
        for action in ("activate", "deactivate")
        for method in ("GET", "POST")
    },
    ("POST", "/lanes/{lane}/restart"): Grant(Access.MUTATE, peers=True),
    ("POST", "/lanes/{lane}/rank-sleep"): Grant(Access.MUTATE, peers=True),
}


def test_every_route_of_the_app_declares_its_access() -> None:
    seen = {}
    for route in APP.routes:
        for method in sorted(getattr(route, "methods", None) or ()):
            if method != "HEAD":
                seen[(method, route.path)] = ROUTES.grants[id(route)]  # type: ignore[attr-defined]
    assert seen == EXPECTED
    # The door's fast paths are routes of the app, under the access they declare above.
    fast = set(APP.door.fast)  # type: ignore[union-attr]
    assert fast and fast <= set(EXPECTED), fast


def test_a_route_that_declares_no_access_is_refused_at_start() -> None:
    from fastapi import FastAPI

    bare = FastAPI()

    @bare.get("/undeclared")
    async def undeclared() -> None: ...

    with pytest.raises(LookupError, match="declares no access"):
        Routes(bare.routes)


def scope(method: str, path: str, *headers: tuple[str, str], query: str = "") -> dict[str, Any]:
    """The scope uvicorn hands over: the path percent-decoded, the raw path and query kept."""
    raw = [(k.lower().encode(), v.encode()) for k, v in headers]
    return {"type": "http", "method": method, "path": unquote(path), "raw_path": path.encode(), "headers": raw, "query_string": query.encode(), "root_path": ""}  # fmt: skip


def code(answer: Any) -> str | None:
    return None if answer is None else json.loads(answer.body)["error"]["code"]


def test_the_host_must_be_lanes_own_and_the_first_host_header_counts() -> None:
    assert (
        code(GUARD.refusal(scope("GET", "/healthz", ("Host", "evil.example")))) == "forbidden-host"
    )
    assert code(GUARD.refusal(scope("GET", "/healthz"))) == "forbidden-host"
    assert code(GUARD.refusal(scope("GET", "/healthz", HOST, ("Host", "evil.example")))) is None


def test_a_cross_site_request_may_not_change_lanes_nor_post_to_v1() -> None:
    origin = ("Origin", "http://evil.example")
    assert code(GUARD.refusal(scope("GET", "/lanes/a/activate", HOST, origin))) == "cross-site"
    assert code(GUARD.refusal(scope("POST", "/v1/chat/completions", HOST, ("Sec-Fetch-Site", "cross-site")))) == "cross-site"  # fmt: skip
    assert code(GUARD.refusal(scope("GET", "/healthz", HOST, origin))) is None


def test_the_token_for_laned_but_the_lanes_key_for_v1() -> None:
    assert code(GUARD.refusal(scope("GET", "/lanes", HOST))) == "unauthorized"
    assert code(GUARD.refusal(scope("GET", "/lanes", HOST, ("Authorization", "Bearer no")))) == "forbidden"  # fmt: skip
    assert code(GUARD.refusal(scope("GET", "/lanes", HOST, TOKEN))) is None
    assert code(GUARD.refusal(scope("GET", "/healthz", HOST))) is None
    # The engine judges an OpenAI request's key; laned does not ask for its token there.
    assert code(GUARD.refusal(scope("POST", "/v1/completions", HOST, ("Authorization", "Bearer sk-lane")))) is None  # fmt: skip


def test_the_path_is_judged_by_the_route_it_resolves_to() -> None:
    # Starlette's `$` matches before a trailing newline: the guard saw a read, the route ran.
    for path in ("/lanes/a/deactivate%0A", "/lanes/a/activate%0a", "/lanes/a%0A/activate", "/lanes/a/activate%20", "/lanes/a/activate%09", "/lanes/a/restart%0D%0A"):  # fmt: skip
        assert code(GUARD.refusal(scope("GET", path, HOST, query="force=true"))) == "bad-path", path
    assert code(GUARD.refusal(scope("GET", "/lanes/a/Activate", HOST))) == "not-found"
    assert code(GUARD.refusal(scope("GET", "/lanes/a/activate/", HOST))) == "not-found"
    assert code(GUARD.refusal(scope("GET", "/lanes/a/restart", HOST, TOKEN))) == "method-not-allowed"  # fmt: skip


def test_rank_only_needs_the_peer_token_on_a_lane_over_several_hosts_in_every_spelling() -> None:
    spellings = ("rank_only=true", "rank_only=1", "x=1&rank_only=TRUE", "rank_only=false&rank_only=1", "rank_only=yes", "rank_only=on", "rank_only=t", "rank%5Fonly=true", "rank_only=Y")  # fmt: skip
    for query in spellings:
        refused = GUARD.refusal(scope("POST", "/lanes/pair/activate", HOST, TOKEN, query=query))
        assert code(refused) == "forbidden", query
        granted = scope("POST", "/lanes/pair/activate", HOST, PEER, query=query)
        assert code(GUARD.refusal(granted)) is None, query
        assert granted[guard.CALL].rank_only is True
        # Not a lane over several hosts: the peer token opens nothing of it.
        assert code(GUARD.refusal(scope("POST", "/lanes/solo/activate", HOST, PEER, query=query))) == "forbidden"  # fmt: skip
    assert code(GUARD.refusal(scope("POST", "/lanes/pair/activate", HOST, PEER, query="rank_only=maybe"))) == "bad-request"  # fmt: skip
    plain = scope("GET", "/lanes", HOST, TOKEN, query="rank_only=1&rank_only=0")
    assert code(GUARD.refusal(plain)) is None and plain[guard.CALL].rank_only is False


def test_the_peer_token_opens_only_what_peers_need() -> None:
    assert code(GUARD.refusal(scope("GET", "/lanes/pair", HOST, PEER))) is None
    assert (
        code(GUARD.refusal(scope("POST", "/lanes/pair/deactivate", HOST, PEER))) is None
    )  # the head's forward
    for method, path in (("POST", "/reload"), ("GET", "/lanes"), ("POST", "/lanes/solo/activate"), ("GET", "/lanes/solo"), ("POST", "/lanes/pair/check"), ("GET", "/events")):  # fmt: skip
        assert code(GUARD.refusal(scope(method, path, HOST, PEER))) == "forbidden", path


async def _through_the_app(method: str, raw_path: str, query: str, headers: list[tuple[str, str]]) -> int:  # fmt: skip
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    request = scope(method, raw_path, HOST, *headers, query=query)
    request.update(http_version="1.1", scheme="http", server=("127.0.0.1", 9000), client=("127.0.0.1", 5000))  # fmt: skip
    await APP(request, receive, send)
    return int(sent[0]["status"])


MUTATING = ("activate", "deactivate", "restart", "check")
SUFFIXES = ("", "%0A", "%0a", "%0D", "%20", "%09", "%00", "%0B", "%0C", "%85", "%C2%85", "%E2%80%A8", "/", "//", "%2F", "/.", ";", "%3B", "#", "?", "\\")  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(
    action=st.sampled_from(MUTATING),
    method=st.sampled_from(("GET", "POST", "GET", "POST", "PUT", "HEAD", "OPTIONS", "DELETE")),
    suffix=st.sampled_from(SUFFIXES),
    lane=st.sampled_from(("a", "pair", "a", "pair", "A", "a%2Fb", "%61", "a%0A", "..", "a.b")),
    upper=st.one_of(st.just(-1), st.just(-1), st.integers(0, 30)),
    query=st.lists(
        st.tuples(
            st.sampled_from(
                ("rank_only", "rank%5Fonly", "RANK_ONLY", "force", "wait", "rank_only%00")
            ),
            st.sampled_from(("true", "1", "yes", "on", "t", "y", "TRUE", "", "0%0A", "maybe")),
        ),
        max_size=2,
    ),
    auth=st.sampled_from(
        ((), (), (("Authorization", "Bearer wrong"),), (PEER,), (("Authorization", "t0k"),))
    ),
    prefix=st.sampled_from(("", "", "/", "//", "/.")),
)
def test_no_spelling_of_a_mutating_route_gets_past_without_the_token(
    action: str,
    method: str,
    suffix: str,
    lane: str,
    upper: int,
    query: list[tuple[str, str]],
    auth: tuple[tuple[str, str], ...],
    prefix: str,
) -> None:
    FRONT.calls.clear()
    path = f"{prefix}/lanes/{lane}/{action}{suffix}"
    if 0 <= upper < len(path):
        path = path[:upper] + path[upper].upper() + path[upper + 1 :]
    qs = "&".join(f"{k}={v}" for k, v in query)
    status = asyncio.run(_through_the_app(method, path, qs, list(auth)))
    assert FRONT.calls == [], (method, path, qs, auth, FRONT.calls)
    assert status in (400, 401, 403, 404, 405), (method, path, qs, status)


class Listing:
    """A front with two lanes, as GET /v1/models reads it."""

    traffic = None
    statuses: ClassVar[dict[str, Any]] = {}

    def __init__(self) -> None:
        from laned.validation.load import parse_config

        text = "".join(
            f'[lanes.{n}]\nport = {p}\nserved_model_name = "{m}"\nexec = {{ command = ["/e"] }}\n'
            for n, p, m in (("secret-lane", 8001, "m1"), ("b", 8002, "m2"))
        )
        self.config = parse_config(text, "t.toml", {"HOME": "/home/op"})

    def lanes(self) -> list[str]:
        return sorted(self.config.lanes)

    def status(self, lane: str) -> Any:
        from laned.core.lanes import LaneStatus
        from laned.core.modes import Mode

        return LaneStatus(lane, Mode.READY if lane == "b" else Mode.INACTIVE)


def test_v1_models_tells_laned_state_only_to_who_may_read_it() -> None:
    """Issue 53: with token_for_reads, GET /v1/models listed every lane and its state to
    anyone. OpenAI's clients list models with the engine's key (Authorization: Bearer
    sk-...), which is not laned's token: they get the names, in OpenAI's fields alone; laned's
    token (or no token_for_reads) gets each lane's state too."""

    async def listed(settings: ApiSettings, *headers: tuple[str, str]) -> dict[str, Any]:
        app = create_app(Listing(), settings)  # type: ignore[arg-type]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        request = scope("GET", "/v1/models", HOST, *headers)
        request.update(http_version="1.1", scheme="http", server=("127.0.0.1", 9000), client=("127.0.0.1", 5000))  # fmt: skip
        await app(request, receive, send)
        assert sent[0]["status"] == 200, sent
        return json.loads(sent[1]["body"])  # type: ignore[no-any-return]

    guarded = ApiSettings("127.0.0.1", 9000, token="t0k", token_for_reads=True)
    names = [{"id": "m2", "object": "model", "owned_by": "laned"},
             {"id": "m1", "object": "model", "owned_by": "laned"}]  # fmt: skip
    for who in ((), (("Authorization", "Bearer sk-engine-key"),), (("Authorization", "t0k"),)):
        body = asyncio.run(listed(guarded, *who))
        assert sorted(body["data"], key=lambda m: m["id"], reverse=True) == names, who
        assert "secret-lane" not in json.dumps(body) and "inactive" not in json.dumps(body)
    for settings_, who in ((guarded, (TOKEN,)), (ApiSettings("127.0.0.1", 9000, token="t0k"), ())):  # fmt: skip
        body = asyncio.run(listed(settings_, *who))
        states = {m["id"]: m["laned"]["state"] for m in body["data"]}
        assert states == {"m1": "inactive", "m2": "ready"}, body
