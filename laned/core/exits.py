"""An engine's exit, judged (pure): the serve wrapper's record of it, what systemd says, what
the status means, and whether anybody asked for it. An exit is `requested` only when a stop
reached the engine before it exited; anything else, status 0 included, is a failure.
"""

from __future__ import annotations

from dataclasses import dataclass

from laned.core.lanes import Verdict
from laned.core.unit_state import CLD_DUMPED, CLD_KILLED, Result, UnitSnapshot


@dataclass(frozen=True)
class ExitRecord:
    """What the serve wrapper wrote about the engine's exit: `requested` when a stop reached
    it while the engine ran, `late` when one came only after the engine had exited."""

    status: int
    requested: bool
    at: float
    oom_killed: bool = False
    late: bool = False


def parse_exit_record(text: str) -> ExitRecord | None:
    """Parse the wrapper's `status=N requested=0|1 [late=0|1] at=EPOCH [oom=0|1]` line."""
    try:
        fields = dict(part.split("=", 1) for part in text.split() if "=" in part)
        return ExitRecord(
            int(fields["status"]),
            fields["requested"] == "1",
            float(fields["at"]),
            fields.get("oom") == "1",
            fields.get("late") == "1",
        )
    except (KeyError, ValueError):
        return None


def decode_status(status: int) -> tuple[int | None, int | None]:
    """Split a shell-style status into (code, signal): 137 -> (None, 9), 3 -> (3, None)."""
    if status > 128 and status - 128 < 65:
        return None, status - 128
    return status, None


@dataclass(frozen=True)
class ExitFacts:
    """An engine exit as far as it can be known: code or signal, who asked, OOM.

    `witnessed`: the serve wrapper saw the exit and wrote down whether a stop reached the
    engine before it (`requested_by_systemd`), so the order is known; without its record
    only systemd's Result says whether the unit was stopped. `late_stop`: a stop arrived
    after the engine had already exited (during the wrapper's clean-up)."""

    code: int | None
    signal: int | None
    requested_by_systemd: bool
    oom_killed: bool
    lost: bool = False  # its user manager went away (killed), and the engine with it
    witnessed: bool = False
    late_stop: bool = False
    timed_out: bool = False  # systemd's Result=timeout: it killed what outlived stop_timeout

    def describe(self, command: str = "") -> str:
        """`status N` or `signal N`, with what it usually means and OOM where podman said so."""
        if self.lost:
            return "no status known: the user manager that ran it went away, and the engine with it"
        what = f"signal {self.signal}" if self.signal is not None else f"status {self.code}"
        meaning = explain_exit(self.code, self.signal, command)
        if self.timed_out and self.signal == 9:  # vLLM with a wedged EngineCore (docs/simulator.md)
            meaning = (
                "SIGKILL from systemd: not gone within stop_timeout of SIGTERM (Result=timeout)"
            )
        what += f" ({meaning})" if meaning else ""
        return what + (", OOM-killed (podman: OOMKilled)" if self.oom_killed else "")


WRAPPER_EXIT_0 = 75  # the serve wrapper's status for an engine that exited 0 on its own


def explain_exit(code: int | None, signal: int | None, command: str = "") -> str:
    """What an exit status usually means: shells' 126/127, 128+N for a signal (how a
    container reports one), laned's own 75; "" when it means nothing in particular."""
    if signal is None and code is not None and code > 128:
        signal = code - 128
    if signal is not None:
        return {
            9: "SIGKILL: killed, often by the kernel's OOM killer (journalctl -k | grep -i oom)",
            11: "SIGSEGV: the engine crashed (segmentation fault)",
            6: "SIGABRT: the engine aborted (a failed assertion, often in CUDA or NCCL)",
            15: "SIGTERM: asked to stop",
        }.get(signal, "")
    named = f": {command}" if command else ""
    return {
        126: f"the command is not executable{named}",
        127: f"command not found{named}",
        WRAPPER_EXIT_0: "laned's wrapper: the engine exited with status 0 on its own",
    }.get(code or 0, "")


def exit_facts(record: ExitRecord | None, started_at: float, snap: UnitSnapshot) -> ExitFacts:
    """The wrapper's record of this run where there is one (the engine's own status, not the
    wrapper's mapping of it), else what systemd says about the unit's main process."""
    if record is not None and record.at >= started_at - 2:
        code, signal = decode_status(record.status)
        return ExitFacts(
            code, signal, record.requested, record.oom_killed, witnessed=True, late_stop=record.late
        )
    by_systemd = snap.result == Result.SUCCESS
    timed_out = snap.result == Result.TIMEOUT
    if snap.exec_main_code in (CLD_KILLED, CLD_DUMPED):
        return ExitFacts(None, snap.exec_main_status, by_systemd, False, timed_out=timed_out)
    return ExitFacts(snap.exec_main_status, None, by_systemd, False, timed_out=timed_out)


# A run that a new user manager knows nothing of (the one that ran it was killed): a failure.
LOST_WITH_MANAGER = ExitFacts(None, None, False, False, lost=True)


def judge_exit(requested_by_laned: bool, facts: ExitFacts) -> Verdict:
    """An exit is `requested` only when a stop somebody asked for reached the engine before
    it exited; anything else — status 0 too — fails. Where the wrapper saw the exit, its
    record decides: an engine that exited before laned's stop reached it (laned restarting
    it after failed probes, say) exited on its own. Without the record, a stop laned or
    systemd was making is taken as the cause."""
    if facts.witnessed:
        return Verdict.REQUESTED if facts.requested_by_systemd else Verdict.FAILURE
    return (
        Verdict.REQUESTED if requested_by_laned or facts.requested_by_systemd else Verdict.FAILURE
    )
