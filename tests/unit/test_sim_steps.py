"""The simulated engine's decode steps (laned.sim.steps): one clock for every running request,
as one vLLM engine step makes a token for each of them."""

from __future__ import annotations

from laned.sim.steps import DecodeSteps


def test_requests_that_start_apart_make_their_tokens_at_the_same_steps() -> None:
    steps = DecodeSteps(100.0, since=1000.0)  # a step every 10 ms
    first = steps.next(None, 1000.0031)  # a prefill ends 3.1 ms into step 0
    other = steps.next(None, 1000.0177)
    assert (first, other) == (1, 2)
    assert steps.at(first) == 1000.01
    later = [first]
    for _ in range(3):
        later.append(steps.next(later[-1], steps.at(later[-1]) + 0.0002))
    assert later == [1, 2, 3, 4]
    assert steps.next(other, steps.at(other) + 0.0002) == 3  # the same step as the first's third


def test_a_prefill_that_ends_on_a_boundary_samples_at_that_step() -> None:
    steps = DecodeSteps(50.0, since=0.0)
    assert steps.next(None, 0.04) == 2  # 0.04 * 50 is 2.0000000000000004 in floats


def test_a_request_that_fell_behind_goes_on_from_the_step_under_way_not_in_a_burst() -> None:
    steps = DecodeSteps(100.0, since=0.0)
    # Stalled from step 5 to 1.234 s: its next token is at the step that has begun (123),
    # the one after at 124, not 118 tokens at once.
    resumed = steps.next(5, 1.234)
    assert resumed == 123 and steps.at(resumed) <= 1.234
    assert steps.next(resumed, 1.2341) == 124


def test_a_token_a_little_late_keeps_its_step() -> None:
    steps = DecodeSteps(100.0, since=0.0)
    # The loop woke 1.5 ms after step 8 began: the token is step 8's, sent now.
    assert steps.next(7, 0.0815) == 8
