"""The memory budget of requests in flight (laned.api.budget) and the listener's sizing and
counting of clients (laned.api.limits), without a server: claims held in arrival order, never
more than the budget, every byte given back."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from laned.api.budget import CEILING, FLOOR, MAX_WAITING, Budget, Claim, default_capacity
from laned.api.limits import MIB, Limits, client_of
from laned.config.listener import BODY_COPIES, LimitsConfig


def test_claims_that_fit_are_held_at_once_and_the_rest_wait_in_order() -> None:
    budget = Budget(10)
    granted: list[str] = []
    a = budget.claim(6, lambda: granted.append("a"))
    b = budget.claim(6, lambda: granted.append("b"))
    c = budget.claim(1, lambda: granted.append("c"))  # fits, but does not overtake b
    assert a is not None and b is not None and c is not None
    assert (a.size, b.pending, c.pending, budget.held) == (6, 6, 1, 6)
    a.release()
    assert granted == ["b", "c"] and budget.held == 7
    a.release()  # idempotent
    assert budget.held == 7
    b.release()
    c.release()
    assert budget.held == 0 and budget.waiting() == 0


def test_a_claim_larger_than_the_budget_is_held_alone() -> None:
    budget = Budget(10)
    big = budget.claim(25, lambda: None)
    assert big is not None and big.size == 25
    small = budget.claim(1, lambda: None)
    assert small is not None and small.pending == 1
    big.release()
    assert small.size == 1


def test_a_growing_body_waits_first_in_line_holding_what_it_has() -> None:
    budget = Budget(10)
    granted: list[str] = []
    chunked = budget.claim(4, lambda: granted.append("chunked"))
    other = budget.claim(4, lambda: granted.append("other"))
    late = budget.claim(4, lambda: granted.append("late"))
    assert chunked is not None and other is not None and late is not None
    assert not chunked.grow(4)  # 12 > 10: waits, ahead of `late`
    assert (chunked.size, chunked.pending) == (4, 4)
    other.release()
    assert granted == ["chunked"] and chunked.size == 8 and budget.held == 8
    chunked.release()
    assert granted == ["chunked", "late"] and budget.held == 4


def test_no_more_than_max_waiting_wait() -> None:
    budget = Budget(1)
    assert budget.claim(1, lambda: None) is not None
    waiting = [budget.claim(1, lambda: None) for _ in range(MAX_WAITING)]
    assert all(c is not None and c.pending for c in waiting)
    assert budget.claim(1, lambda: None) is None  # refused at once
    assert budget.waiting() == MAX_WAITING


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(1, 50),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["claim", "grow", "release"]), st.integers(1, 30), st.integers(0, 20)
        ),
        max_size=40,
    ),
)
def test_the_budget_never_holds_more_than_it_has_and_gives_every_byte_back(
    capacity: int, steps: list[tuple[str, int, int]]
) -> None:
    budget = Budget(capacity)
    claims: list[Claim] = []
    for action, size, pick in steps:
        if action == "claim":
            claim = budget.claim(size, lambda: None)
            if claim is not None:
                claims.append(claim)
        elif claims:
            chosen = claims[pick % len(claims)]
            if action == "grow" and chosen.size and not chosen.pending and not chosen.ended:
                chosen.grow(size)
            elif action == "release":
                chosen.release()
        live = [c for c in claims if not c.ended]
        assert budget.held == sum(c.size for c in live)
        holders = [c for c in live if c.size]
        assert budget.held <= capacity or len(holders) == 1  # over it only alone
        assert budget.peak >= budget.held
    for claim in claims:
        claim.release()
    assert budget.held == 0 and budget.waiting() == 0


def test_the_default_budget_follows_the_memory_laned_may_use() -> None:
    assert default_capacity(None) == FLOOR
    assert default_capacity(4 * 1024 * MIB) == FLOOR  # a 32nd of 4 GiB is under the floor
    assert default_capacity(24 * 1024 * MIB) == 768 * MIB
    assert default_capacity(2 * 1024 * 1024 * MIB) == CEILING
    config = LimitsConfig()
    assert Limits.of(config, 4096, 24 * 1024 * MIB).request_memory == 768 * MIB
    given_one = LimitsConfig(request_memory_mib=100)
    assert Limits.of(given_one, 4096, 24 * 1024 * MIB).request_memory == 100 * MIB
    # Never below one body at the limit.
    huge = LimitsConfig(max_body_mib=512)
    assert Limits.of(huge, 4096, 24 * 1024 * MIB).request_memory == BODY_COPIES * 512 * MIB


def test_a_host_counts_as_one_client_whatever_its_loopback_address() -> None:
    assert client_of("127.0.0.1") == client_of("127.0.0.2") == client_of("::1") == "loopback"
    assert client_of("::ffff:127.0.0.5") == "loopback"
    assert client_of("10.0.0.1") != client_of("10.0.0.2")
    assert client_of("2001:db8::1") == client_of("2001:db8::ffff") == "2001:db8::/64"
    assert client_of("2001:db8:0:1::1") != client_of("2001:db8::1")
    assert client_of("::ffff:10.0.0.1") == "10.0.0.1"
    assert client_of("") == ""
