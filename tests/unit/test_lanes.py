"""The supervisor's pure decisions: exits, backoff, crash loops, stalls, startup phases, state files."""

from __future__ import annotations

import asyncio
from pathlib import Path

from laned.adapters import state
from laned.adapters.probes import parse_engine_metrics
from laned.adapters.secret_files import read_api_key
from laned.adapters.systemd import unit_name_from_path
from laned.core.exits import ExitFacts, decode_status, judge_exit
from laned.core.lanes import Desired, Event, LaneState, LastExit, Verdict
from laned.core.liveness import EngineSample, StallDetector
from laned.core.policy import backoff_delay, is_crash_loop
from laned.core.saved import Saved
from laned.core.unit_state import UnitSnapshot
from laned.owner.wiring import read_exit_record
from tests.helpers import parse_phase


def test_only_a_requested_stop_is_not_a_failure() -> None:
    unseen, stopped = ExitFacts(0, None, False, False), ExitFacts(0, None, True, False)
    assert judge_exit(False, unseen) is Verdict.FAILURE
    assert judge_exit(True, unseen) is Verdict.REQUESTED
    assert judge_exit(False, stopped) is Verdict.REQUESTED
    # Where the wrapper saw the exit, its order decides, whatever laned was doing.
    own = ExitFacts(0, None, False, False, witnessed=True, late_stop=True)
    assert judge_exit(True, own) is Verdict.FAILURE
    assert judge_exit(True, ExitFacts(0, None, True, False, witnessed=True)) is Verdict.REQUESTED


def test_status_decoding() -> None:
    assert decode_status(0) == (0, None)
    assert decode_status(3) == (3, None)
    assert decode_status(137) == (None, 9)
    assert decode_status(143) == (None, 15)


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [backoff_delay(15, n, 300) for n in range(1, 8)] == [15, 30, 60, 120, 240, 300, 300]
    assert backoff_delay(1, 0, 10) == 1


def test_crash_loop_counts_only_recent_failures() -> None:
    assert is_crash_loop([100, 110, 120], now=130, burst=3, interval=60)
    assert not is_crash_loop([10, 110, 120], now=130, burst=3, interval=60)


def test_stall_needs_busy_and_flat_tokens_for_the_whole_window() -> None:
    detector = StallDetector(after=10)
    busy = EngineSample(running=2, waiting=1, generation_tokens=50, prompt_tokens=20)
    assert not detector.observe(busy, 0)
    assert not detector.observe(busy, 9)
    assert detector.observe(busy, 10)
    moving = EngineSample(running=2, waiting=1, generation_tokens=51, prompt_tokens=20)
    assert not detector.observe(moving, 11)  # a token moved: the clock starts again
    assert not detector.observe(moving, 20)
    assert detector.observe(moving, 21)
    idle = EngineSample(running=0, waiting=0, generation_tokens=51, prompt_tokens=20)
    assert not detector.observe(idle, 100)  # idle is not stalled
    assert not detector.observe(idle, 1000)


def test_an_unanswered_scrape_runs_the_stall_clock_on_while_busy() -> None:
    # llama-server's /metrics can hang behind a wedged decode loop while /health answers.
    detector = StallDetector(after=10)
    idle = EngineSample(running=0, waiting=0, generation_tokens=5, prompt_tokens=2)
    assert not detector.observe(idle, 0)
    busy = EngineSample(running=1, waiting=0, generation_tokens=5, prompt_tokens=2, steps=7)
    assert not detector.observe(busy, 101)
    assert not detector.unanswered(110)
    assert detector.unanswered(111)  # busy, and nothing seen to move for 10 s
    moved = EngineSample(running=1, waiting=0, generation_tokens=5, prompt_tokens=2, steps=8)
    assert not detector.observe(moved, 112)  # a step: the clock starts again
    assert not detector.unanswered(121)


def test_scrapes_unanswered_for_the_whole_window_are_a_stall_even_after_an_idle_one() -> None:
    # The request that wedged llama-server came after the last scrape, which read it idle.
    detector = StallDetector(after=10)
    idle = EngineSample(running=0, waiting=0, generation_tokens=5, prompt_tokens=2)
    assert not detector.observe(idle, 0)
    assert not detector.unanswered(5)
    assert not detector.unanswered(14)  # two in a row, but 9 s: not yet
    assert detector.unanswered(15) and detector.unanswered_for(15) == 10
    # One lost scrape is not a verdict, however long it took.
    single = StallDetector(after=10)
    assert not single.unanswered(100)
    # An answer in between starts the count again: a page without laned's numbers too.
    again = StallDetector(after=10)
    assert not again.unanswered(0)
    again.answered()
    assert not again.unanswered(8) and not again.unanswered(17)
    assert again.unanswered(18) and again.unanswered_for(18) == 10
    assert not again.observe(idle, 19) and again.unanswered_for(19) == 0


def test_phases_from_vllm_log_lines() -> None:
    assert parse_phase(
        "Loading safetensors checkpoint shards:  37% Completed | 3/8 [00:01<00:02]"
    ) == (
        "loading weights",
        37.5,
    )
    line = "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  40%|████      | 4/10 [00:00<00:00]"
    assert parse_phase(line) == ("capturing CUDA graphs", 40.0)
    assert parse_phase("INFO 12-02 [default_loader.py:262] Loading weights took 12.3 seconds") == (
        "weights loaded",
        None,
    )
    assert parse_phase("INFO:     Application startup complete.") == ("serving", None)
    assert parse_phase("something unknown \x00 ☃") is None


def test_exit_record_and_api_key_parsing(tmp_path: Path) -> None:
    record = tmp_path / "last-exit"
    record.write_text("status=0 requested=0 at=1700000000\n")
    parsed = read_exit_record(str(record))
    assert parsed is not None and parsed.status == 0 and not parsed.requested
    record.write_text("garbage")
    assert read_exit_record(str(record)) is None
    keyfile = tmp_path / "k.env"
    keyfile.write_text('# comment\nVLLM_API_KEY="sk-1"\nOTHER=x\n')
    assert read_api_key(str(keyfile), "VLLM_API_KEY") == "sk-1"
    assert read_api_key(str(keyfile), "LLAMA_API_KEY") is None  # another engine's name
    assert read_api_key(str(tmp_path / "missing"), "VLLM_API_KEY") is None


def test_engine_metrics_summary() -> None:
    text = (
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\n'
        'vllm:generation_tokens_total{engine="0",model_name="m"} 40.0\n'
        'vllm:generation_tokens_total{engine="1",model_name="m"} 2.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
    )
    sample = parse_engine_metrics(text)
    assert (sample.running, sample.waiting, sample.generation_tokens, sample.kv_cache_usage) == (
        2,
        1,
        42,
        0.25,
    )


def test_unit_paths_and_snapshots() -> None:
    assert unit_name_from_path("/org/freedesktop/systemd1/unit/dsv41_2eservice") == "dsv41.service"
    assert (
        unit_name_from_path("/org/freedesktop/systemd1/unit/glm53_2dtr3_2eservice")
        == "glm53-tr3.service"
    )
    snap = UnitSnapshot("a.service").update(
        {"ActiveState": "activating", "SubState": "auto-restart"}
    )
    assert snap.running
    assert not UnitSnapshot("a.service").running
    # A start job queued and not begun: the unit is still inactive, and a stop must be sent.
    queued = UnitSnapshot("a.service").update({"Job": [1234, "/org/freedesktop/systemd1/job/1234"]})
    assert queued.job == 1234 and not queued.running and queued.ending
    assert not queued.update({"Job": [0, "/"]}).ending


def test_state_file_round_trip(tmp_path: Path) -> None:
    saved = Saved(
        desired={"a": Desired.ACTIVE},
        restarts={"a": 2},
        last_exit={"a": LastExit(0, None, 5.0, Verdict.FAILURE)},
        failed={"b": "crash-loop"},
        last_starts={"a": {"cold": 120.5, "weight-cache": 31.0}},
        events=[Event(1.0, "a", LaneState.INACTIVE, LaneState.STARTING, "activate")],
    )
    state.save(str(tmp_path), saved)
    loaded = state.load(str(tmp_path))
    assert loaded.to_json() == saved.to_json()
    assert loaded.last_starts == {"a": {"cold": 120.5, "weight-cache": 31.0}}
    (tmp_path / "state.json").write_text("{not json")
    assert state.load(str(tmp_path)).desired == {}


def test_kv_usage_is_never_added_across_its_two_names_or_its_engines() -> None:
    text = (
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5\n'
        'vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.5\n'
    )
    assert parse_engine_metrics(text).kv_cache_usage == 0.5
    older = 'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.3\n'
    assert parse_engine_metrics(older).kv_cache_usage == 0.3


def test_engine_steps_are_read_from_the_iteration_histogram() -> None:
    text = (
        "# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.\n"
        "# TYPE vllm:iteration_tokens_total histogram\n"
        'vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="m"} 3.0\n'
        'vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="m"} 7.0\n'
        'vllm:iteration_tokens_total_count{engine="0",model_name="m"} 7.0\n'
        'vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 90.0\n'
    )
    assert parse_engine_metrics(text).steps == 7


def test_a_long_prefill_is_no_stall_and_a_frozen_engine_is() -> None:
    detector = StallDetector(after=10)
    # A prefill: one request running, both token counters flat for a minute, but every
    # chunk is an engine step and takes KV-cache blocks.
    for second in range(60):
        sample = EngineSample(1, 0, 500, 8000, kv_cache_usage=0.01 * second, steps=second)
        assert not detector.observe(sample, float(second))
    # Without the step count (a vLLM that does not export it), the KV cache still grows.
    for second in range(60, 120):
        sample = EngineSample(1, 0, 500, 8000, kv_cache_usage=0.01 * second, steps=0)
        assert not detector.observe(sample, float(second))
    frozen = EngineSample(1, 0, 500, 8000, kv_cache_usage=0.5, steps=60)
    assert not detector.observe(frozen, 120.0)
    assert not detector.observe(frozen, 129.0)
    assert detector.observe(frozen, 130.0)


def test_an_unreadable_state_file_is_kept_aside_and_said_with_its_path(tmp_path: Path) -> None:
    assert state.load(str(tmp_path)).problem is None  # none yet: a first start, nothing to say
    path = tmp_path / "state.json"
    path.write_text('{"version": 1, "desired": {"a": "act')
    saved = state.load(str(tmp_path))
    assert saved.desired == {} and saved.problem is not None
    assert str(path) in saved.problem and "state.json.unreadable" in saved.problem
    assert not path.exists() and (tmp_path / "state.json.unreadable").exists()


def test_the_state_writer_says_when_it_cannot_write_and_when_it_can_again(tmp_path: Path) -> None:
    blocker = tmp_path / "blocked"
    blocker.write_text("a file where the state dir should be")
    heard: list[str | None] = []

    async def run() -> None:
        writer = state.StateWriter(str(blocker / "state"), Saved, heard.append)
        writer.mark()
        await writer.flush()
        assert heard and heard[-1] is not None and "cannot write" in heard[-1]
        blocker.unlink()
        await writer.flush()  # still marked: the failed write is tried again
        assert heard[-1] is None and (blocker / "state" / "state.json").exists()

    asyncio.run(run())
