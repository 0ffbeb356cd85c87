"""What a serving engine's health answer means, by its engine's own rule (laned.engines:
HealthRule), and the liveness watch acting on it (laned.owner.watchers.watch_liveness, over a
scripted probe: no I/O): vLLM's and SGLang's 503 is a death reported at once, llama-server's
is counted as a failed probe, and a log line that says the engine is dying has its health
asked at once, then often, not at the next probe.interval."""

from __future__ import annotations

import asyncio
import contextlib
import time

from laned import engines
from laned.config.model import LaneConfig
from laned.core.phases import DYING
from laned.engines import LLAMACPP, SGLANG, VLLM
from laned.owner import watchers
from laned.validation.load import parse_config

COMMANDS = {
    "vllm": '["vllm", "serve", "/m"]',
    "sglang": '["python", "-m", "sglang.launch_server", "--model-path", "/m"]',
    "llamacpp": '["llama-server", "-m", "/m.gguf"]',
}


def lane(engine: str, interval: str = "60s") -> LaneConfig:
    text = (
        f'[lanes.a]\nunit = "a.service"\nport = 8000\nserved_model_name = "a"\n'
        f'probe = {{ interval = "{interval}", failures = 3, stall_after = "1h" }}\n'
        f"[lanes.a.exec]\ncommand = {COMMANDS[engine]}\n"
    )
    return parse_config(text, "t.toml", {"HOME": "/home/op"}).lanes["a"]


class Engine:
    """A serving engine's probe: /health answers `status` from `dies` (monotonic) on, 200
    before; /metrics is not read (None), nor the host's memory (it stands for the page cache
    too)."""

    def __init__(self, status: int | None, dies: float = 0.0) -> None:
        self.status, self.dies = status, dies
        self.asked: list[float] = []

    async def health(self, port: int, path: str = "/health") -> int | None:
        now = time.monotonic()
        self.asked.append(now)
        return self.status if now >= self.dies else 200

    async def sample(self, spec: LaneConfig) -> None:
        return None

    def mem_available(self) -> None:
        return None


def watch(
    engine: Engine, spec: LaneConfig, alarm_at: float | None = None, limit: float = 3
) -> list[watchers.Observation]:
    """What watch_liveness reports until it stops (or `limit` seconds pass)."""
    seen: list[watchers.Observation] = []

    def report(observation: watchers.Observation) -> bool:
        seen.append(observation)  # as the owner: the limit of failed probes ends the watch
        failed = isinstance(observation, watchers.ProbeFailed)
        return not (failed and observation.failures >= observation.limit)

    async def run() -> None:
        alarm = asyncio.Event()
        if alarm_at is not None:
            asyncio.get_running_loop().call_later(alarm_at, alarm.set)
        watching = watchers.watch_liveness(engine, engine, spec, report, alarm)  # type: ignore[arg-type]
        with contextlib.suppress(asyncio.TimeoutError):  # a watch that goes on: cut at `limit`
            await asyncio.wait_for(watching, limit)

    asyncio.run(run())
    return seen


def test_each_engine_says_which_health_answers_mean_it_is_dead() -> None:
    assert VLLM.health.says_dead(503) and SGLANG.health.says_dead(503)
    assert not LLAMACPP.health.says_dead(503)  # llama-server's 503 is "Loading model"
    for profile in (VLLM, SGLANG, LLAMACPP):
        assert not profile.health.says_dead(200) and not profile.health.says_dead(None)
        assert not profile.health.says_dead(500)


def test_a_503_of_a_serving_vllm_is_its_death_reported_at_the_first_probe() -> None:
    seen = watch(Engine(503), lane("vllm", "100ms"))
    dead = [s for s in seen if isinstance(s, watchers.SaidDead)]
    assert [s for s in seen if isinstance(s, watchers.ProbeFailed)] == []
    assert len(dead) == 1 and dead[0].status == 503 and "EngineDeadError" in dead[0].why
    assert isinstance(seen[-1], watchers.SaidDead)  # and the watch ends there


def test_llama_servers_503_is_a_failed_probe_counted_to_the_limit() -> None:
    seen = watch(Engine(503), lane("llamacpp", "100ms"))
    failed = [s.failures for s in seen if isinstance(s, watchers.ProbeFailed)]
    assert failed == [1, 2, 3] and not any(isinstance(s, watchers.SaidDead) for s in seen)


def test_no_answer_is_a_failed_probe_for_every_engine() -> None:
    for engine in ("vllm", "sglang"):
        seen = watch(Engine(None), lane(engine, "100ms"))
        assert [s.failures for s in seen if isinstance(s, watchers.ProbeFailed)] == [1, 2, 3]


def test_an_engine_that_says_it_is_dying_is_asked_at_once_and_then_often() -> None:
    # Probing every 60 s; the engine logs its death 0.3 s in, and its health still answers 200
    # for 0.5 s more (vLLM learns of its core's death from a monitor thread).
    began = time.monotonic()
    engine = Engine(503, dies=began + 0.8)
    seen = watch(engine, lane("vllm", "60s"), alarm_at=0.3)  # cut at 3 s: probes are the alarm's
    assert isinstance(seen[-1], watchers.SaidDead)
    assert len(engine.asked) >= 2  # asked at once (200), then again until the 503


def test_the_engines_dying_lines_are_read_as_such_and_nothing_else_is() -> None:
    lines = [
        (VLLM, [
            "(APIServer pid=1) WARNING 12-07 10:00:00 [core_client.py:817] [shutdown] MPClient: "
            "engine core exited unexpectedly; starting cleanup",
            "(EngineCore pid=2) ERROR 12-07 10:00:00 [core.py:1512] EngineCore encountered a "
            "fatal error.",
            "ERROR 12-07 10:00:00 [async_llm.py:906] AsyncLLM output_handler failed.",
        ]),
        (SGLANG, [
            "[2026-12-07 10:00:00] SIGQUIT received. signum=None, frame=None. It usually means "
            "one child failed.",
            "[2026-12-07 10:00:00] Received sigquit from a child process. It usually means the "
            "child failed.",
        ]),
    ]  # fmt: skip
    for profile, said in lines:
        for line in said:
            found = profile.read_log(line)
            assert found is not None and found.note == DYING, (profile.name, line)
    quiet = (
        "INFO 12-07 10:00:00 [api_server.py:1] Starting vLLM API server 0 on http://0.0.0.0:8000"
    )
    assert VLLM.read_log(quiet) == VLLM.read_line(quiet)
    assert LLAMACPP.health.dying is None
    assert engines.for_lane(lane("llamacpp")).read_log("srv  load_model: loading model") == (
        LLAMACPP.read_line("srv  load_model: loading model")
    )
