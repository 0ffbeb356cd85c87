"""The API guard: its token comparison, whose time must not tell the token
(bench/token_timing.py measures it; here, that every comparison is of two values of one
length, whatever was sent), and who may call, judged from the raw request as the server hands
it over."""

from __future__ import annotations

import hmac
import json
from typing import Any

import pytest

from laned.api import guard
from laned.api.guard import ApiSettings, Guard


def test_tokens_are_compared_as_digests_of_one_length(monkeypatch: pytest.MonkeyPatch) -> None:
    lengths: list[tuple[int, int]] = []
    compare = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        lengths.append((len(a), len(b)))
        return compare(a, b)

    monkeypatch.setattr(guard.hmac, "compare_digest", spy)
    secret = "Bearer s3cret-token-of-43-characters-xxxxxxxxxx"
    assert guard.same_secret(secret, secret)
    for given in ("", "Bearer", secret[:-1], secret + "x", "x" + secret[1:], secret * 3):
        assert not guard.same_secret(given, secret), given
    assert lengths and all(pair == (32, 32) for pair in lengths), lengths


def scope(method: str, path: str, *headers: tuple[str, str], query: str = "") -> dict[str, Any]:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers]
    return {"type": "http", "method": method, "path": path, "headers": raw, "query_string": query.encode()}  # fmt: skip


def code(answer: Any) -> str | None:
    return None if answer is None else json.loads(answer.body)["error"]["code"]


GUARD = Guard(ApiSettings("127.0.0.1", 9000, token="t0k", token_for_reads=True, peer_token="p33r"))
HOST = ("Host", "127.0.0.1:9000")


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
    assert (
        code(GUARD.refusal(scope("GET", "/lanes", HOST, ("Authorization", "Bearer t0k")))) is None
    )
    assert code(GUARD.refusal(scope("GET", "/healthz", HOST))) is None
    # The engine judges an OpenAI request's key; laned does not ask for its token there.
    assert code(GUARD.refusal(scope("POST", "/v1/completions", HOST, ("Authorization", "Bearer sk-lane")))) is None  # fmt: skip


def test_rank_only_needs_the_peer_token_whatever_the_spelling_and_the_last_value_counts() -> None:
    peer = ("Authorization", "Bearer p33r")
    for query in ("rank_only=true", "rank_only=1", "x=1&rank_only=TRUE", "rank_only=false&rank_only=1"):  # fmt: skip
        refused = GUARD.refusal(scope("POST", "/lanes/a/activate", HOST, query=query))
        assert code(refused) == "forbidden", query
        assert code(GUARD.refusal(scope("POST", "/lanes/a/activate", HOST, peer, query=query))) is None  # fmt: skip
    assert code(GUARD.refusal(scope("GET", "/lanes", HOST, ("Authorization", "Bearer t0k"), query="rank_only=1&rank_only=0"))) is None  # fmt: skip
