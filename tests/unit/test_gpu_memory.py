"""GPU memory readings judged (laned.core.gpu_memory): what the start gate says when its wait
is over, and whether a sleep is confirmed. `held` itself: test_preflight.py and
test_placement.py."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from laned.core.facts import GIB, GpuReading
from laned.core.gpu_memory import Asleep, GateResult, confirm_sleep, gate_verdict, memory_of
from laned.core.lanes import Refused
from laned.engines import for_lane
from laned.validation.load import parse_config

SLEEPY = (
    '[lanes.a]\nport = 8001\nserved_model_name = "a"\nsleep_level = 1\n'
    'exec = { command = ["vllm", "serve", "/m/a"] }\n'
)


def test_a_released_gate_says_how_long_and_beside_which_lanes() -> None:
    said, refused = gate_verdict(GateResult(True, 1.23456, 3, []))
    assert (said, refused) == ("GPU memory released after 1.235s (3 reading(s))", None)
    said, _ = gate_verdict(GateResult(True, 0.0, 1, []), ("b", "c"))
    assert said == "GPU memory released after 0.000s (1 reading(s)), beside b, c"


def test_a_gate_that_timed_out_refuses_with_what_still_holds_the_memory() -> None:
    result = GateResult(False, 120.04, 480, ["GPU 0 has 8.00 GiB in use by pid 7", "GPU 1 x"])
    said, refused = gate_verdict(result, ("b",))
    assert said == "GPU-memory gate timed out"
    assert refused == Refused(
        "gpu-gate: still held after 120.0s: GPU 0 has 8.00 GiB in use by pid 7; GPU 1 x",
        "see `nvidia-smi` for what holds the GPU memory; `laned status --fit` shows where "
        "laned placed each lane",
    )


def reading(index: int, *processes: tuple[int, int]) -> GpuReading:
    return GpuReading(index, "H100", 80 * GIB, sum(u for _, u in processes), processes)


def test_memory_of_counts_the_processes_asked_on_each_gpu() -> None:
    readings = [reading(0, (1, 5 * GIB), (2, 3 * GIB)), reading(1, (3, GIB))]
    assert memory_of(readings, {1, 3}) == {0: 5 * GIB, 1: GIB}
    assert memory_of(readings, {9}) == {0: 0, 1: 0}
    unlisted = GpuReading(2, "H100", 80 * GIB, GIB, None)  # NVML cannot list its processes
    assert memory_of([*readings, unlisted], {1}) is None


def test_a_sleep_is_refused_when_the_engine_says_it_is_awake() -> None:
    refused = confirm_sleep(2, False, {7}, {0: 8 * GIB}, None)
    assert refused == Refused("sleep (level 2): the engine still says it is awake after the sleep")


def test_a_sleep_without_readings_rests_on_the_engines_word() -> None:
    for says in (True, None):
        assert confirm_sleep(1, says, {7}, None, None) == Asleep(frozenset({7}), {})
        assert confirm_sleep(1, says, {7}, {0: GIB}, None) == Asleep(frozenset({7}), {})


def test_a_sleep_that_released_memory_says_what_stays() -> None:
    slept = confirm_sleep(1, True, {7}, {0: 70 * GIB}, {0: 8 * GIB})
    assert slept == Asleep(
        frozenset({7}), {0: 8 * GIB}, "asleep: 62.00 GiB of GPU memory released, 8.00 GiB stay"
    )


def test_a_sleep_that_released_nothing_is_refused_with_its_engines_hint() -> None:
    hint = for_lane(parse_config(SLEEPY, "t", {"HOME": "/h"}).lanes["a"]).unreleased
    assert hint  # the engine's profile names the switch that gives the memory back
    refused = confirm_sleep(1, None, {7}, {0: 70 * GIB}, {0: 70 * GIB}, hint)
    assert refused == Refused(
        "sleep (level 1): its processes still hold 70.00 GiB of GPU memory, no less than before",
        hint,
    )


@given(
    says=st.sampled_from([True, None]),
    before=st.dictionaries(st.integers(0, 7), st.integers(0, 80 * GIB), max_size=4),
    after=st.dictionaries(st.integers(0, 7), st.integers(0, 80 * GIB), max_size=4),
)
def test_a_sleep_is_confirmed_unless_memory_was_held_and_none_went(
    says: bool | None, before: dict[int, int], after: dict[int, int]
) -> None:
    slept = confirm_sleep(1, says, {7}, before, after)
    refused = sum(before.values()) > 0 and sum(after.values()) >= sum(before.values())
    assert isinstance(slept, Refused) == refused
    if isinstance(slept, Asleep):
        assert slept.residual == after and slept.pids == {7}
