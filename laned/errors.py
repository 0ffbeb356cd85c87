"""laned's exception tree. Every error laned raises on purpose is one of these.

    LanedError                      root: what went wrong, and a hint for what to do
    ├── ConfigError                 the config file is unreadable or invalid (carries every Finding)
    ├── ConfigRefused               a valid new config cannot be applied while laned runs
    ├── UnsafeApi                   the control API would listen unguarded as configured
    ├── SecretFileRefused           a token file laned reads is missing, empty or readable by others
    ├── SecretsFileError            a lane's secrets file has a line systemd would not read
    ├── UsageError                  (CLI) the command's arguments do not say what to do
    ├── EngineParserFailed          vLLM's own argument parser could not be asked for its flags
    ├── BadRequest                  (API) a parameter the endpoint cannot take
    │   └── BodyTooDeep             a request body's JSON nests deeper than the parser reads
    ├── WaitTimedOut                (API) a request asked to wait is not done by its timeout
    ├── RenderError                 generated files could not be read back or differ on disk
    ├── WriteFailed                 a file laned writes (unit, wrapper, state) could not be written
    ├── CommandFailed               a command laned runs could not start or exited non-zero
    ├── CommandLineError            (laned import) a command line laned cannot read without a shell
    │   └── BadImport               ... or that cannot become a lane as it stands
    ├── EngineError                 the simulated engine was started with bad arguments
    │   └── EngineDead              its engine core died (vLLM's EngineDeadError): every request fails
    ├── SystemdError                a call to the systemd user manager failed (D-Bus)
    │   └── BusUnavailable          the user bus cannot be reached at all
    ├── PodmanError                 a call to the podman API service failed
    │   └── PodmanUnavailable       the podman API socket does not answer
    ├── JournalUnavailable          journald's log cannot be read (journalctl missing, or it ended)
    ├── BodyParserLost              (API) the worker reading a large request body died or hung
    ├── PeerUnreachable             another host's laned (a rank of a lane) does not answer
    ├── ApiUnavailable              (CLI) laned's control API does not answer
    ├── ApiRefused                  (CLI) laned answered with an error envelope
    └── LaneError                   a lane operation could not be done
        ├── UnknownLane             no lane of that name in the config
        ├── Superseded              a newer request for the same group replaced this one
        ├── PreflightFailed         preflight found errors: nothing was stopped or started
        ├── ActivationFailed        the lane failed, timed out or crash-looped while starting
        ├── LaneNotRunning          the lane does not serve, so no acceptance gate can run
        ├── RankNotAsleep           a worker's rank did not fall asleep with its head
        ├── NotAContainer           a container's own log asked of a lane that runs none
        ├── EngineUnreachable       the engine does not answer (check, bench)
        ├── EngineRefused           the engine answered a request with an error
        └── EngineBrokeOff          the engine's answer ended before its end (also a ConnectionError)

Every class has a `code`, the word the API's error envelope carries; `laned.api.errors`
maps each class to its HTTP status in one table.

Errors of foreign libraries (pydantic, tomllib, OSError) are translated at the
boundary where they happen: ``raise ConfigError(...) from exc``. Only the CLI turns a
LanedError into an exit code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Severity(str, Enum):
    """How bad a finding is: an error blocks, a warning is reported and let through."""

    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"  # for the record (a check that was skipped, and why)


@dataclass(frozen=True)
class Finding:
    """One thing found before anything runs: by a config rule, on a key path, or by a
    preflight rule, under its name. Where, what, what to do, how bad."""

    where: str  # the config's dotted key path ("lanes.a.port"), or the preflight rule ("image")
    message: str
    hint: str = ""
    severity: Severity = Severity.ERROR

    def render(self, source: str = "") -> str:
        """Format as one or two lines: `file: key.path: message` and an indented hint."""
        where = f"{source}: " if source else ""
        key = f"{self.where}: " if self.where else ""
        tag = "" if self.severity is Severity.ERROR else f"{self.severity.value}: "
        text = f"{where}{tag}{key}{self.message}"
        if self.hint:
            text += f"\n    hint: {self.hint}"
        return text

    def to_json(self) -> dict[str, str]:
        """A preflight finding as the API serves it (`check`: the rule's name)."""
        return {
            "check": self.where,
            "severity": self.severity.value,
            "message": self.message,
            "hint": self.hint,
        }


class LanedError(Exception):
    """Root of laned's errors: a message that says what went wrong and a hint."""

    code = "laned-error"

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message


class ConfigError(LanedError):
    """The config could not be loaded: every problem found, each with its key path."""

    code = "bad-config"

    def __init__(self, source: str, problems: list[Finding]) -> None:
        self.source = source
        self.problems = problems
        errors = [p for p in problems if p.severity is Severity.ERROR]
        count = len(errors)
        head = f"{source}: {count} error{'s' if count != 1 else ''} in the config"
        super().__init__(head, "fix the keys named above and run `laned validate` again")

    def __str__(self) -> str:
        lines = [self.message]
        lines += ["  " + p.render(self.source).replace("\n", "\n  ") for p in self.problems]
        return "\n".join(lines)


class ConfigRefused(LanedError):
    """A valid new config that cannot be applied while laned runs (the old one stays in force)."""

    code = "reload-refused"


class UnsafeApi(LanedError):
    """The control API would be reachable without a guard as configured (a listener off
    loopback without a token, reads behind a token that is not set)."""

    code = "unsafe-api"


class SecretFileRefused(LanedError):
    """A token file laned reads (daemon.token_file, peer_token_file) is missing, empty or
    readable by others."""

    code = "secret-file"


class SecretsFileError(LanedError):
    """A line of a lane's secrets file that systemd would not read as NAME=VALUE (the message
    names the line by its number, never its text: it may hold a value)."""

    code = "secrets-file"


class UsageError(LanedError):
    """(CLI) The command's arguments do not say what to do."""

    code = "usage"


class EngineParserFailed(LanedError):
    """vLLM's own argument parser could not be run or gave no flag list."""

    code = "engine-parser"


class BadRequest(LanedError):
    """(API) A parameter the endpoint cannot take."""

    code = "bad-request"


class BodyTooDeep(BadRequest):
    """A request body's JSON nests deeper than Python's parser reads (its recursion limit)."""

    code = "body-too-deep"


class WaitTimedOut(LanedError):
    """(API) A request that asked to wait is not done by its timeout; it goes on."""

    code = "timeout"


class RenderError(LanedError):
    """Generated files could not be written, or (with --check) differ from what is on disk."""

    code = "render-failed"


class WriteFailed(LanedError):
    """A file laned writes (a unit, a wrapper, state.json) could not be written."""

    code = "write-failed"


class CommandFailed(LanedError):
    """A command laned runs (journalctl, a prepare step) could not start or failed."""

    code = "command-failed"


class CommandLineError(LanedError):
    """A command line laned cannot read without a shell (`laned import`)."""

    code = "bad-command-line"


class BadImport(CommandLineError):
    """The command line cannot become a lane as it stands."""

    code = "bad-import"


class EngineError(LanedError):
    """The simulated engine was given arguments it cannot run with."""

    code = "engine-error"


class EngineDead(EngineError):
    """The simulated engine's core died, as vLLM's EngineDeadError: every request fails from
    now on (the simulator answers each with vLLM's error)."""

    code = "engine-dead"


class SystemdError(LanedError):
    """A call to the systemd user manager failed; carries systemd's error name."""

    code = "systemd-error"

    def __init__(self, message: str, hint: str = "", name: str = "") -> None:
        super().__init__(message, hint)
        self.name = name


class BusUnavailable(SystemdError):
    """The user bus cannot be reached (no user manager, or DBUS_SESSION_BUS_ADDRESS is wrong)."""

    code = "bus-unavailable"


class JournalUnavailable(LanedError):
    """journald's log cannot be read: journalctl is missing, or it ended."""

    code = "journal-unavailable"


class BodyParserLost(LanedError):
    """The worker process that reads a large request body's `model` died or did not answer
    (laned.adapters.body_parser); the request is refused, never read on the event loop."""

    code = "body-parser-lost"


class PodmanError(LanedError):
    """A call to the podman API service failed."""

    code = "podman-error"


class PodmanUnavailable(PodmanError):
    """The podman API socket does not answer (the service is not running or the path is wrong)."""

    code = "podman-unavailable"


class LaneError(LanedError):
    """A lane operation could not be done."""

    code = "lane-error"


class UnknownLane(LaneError):
    """No lane of that name in the config."""

    code = "unknown-lane"


class Superseded(LaneError):
    """A newer activate or deactivate of the same group replaced this request."""

    code = "superseded"


class PreflightFailed(LaneError):
    """Preflight found errors, so the activation was refused: nothing was stopped or started."""

    code = "preflight-failed"

    def __init__(self, message: str, hint: str, findings: Sequence[Finding]) -> None:
        super().__init__(message, hint)
        self.findings = list(findings)


class ActivationFailed(LaneError):
    """The lane failed, timed out or crash-looped while starting."""

    code = "activation-failed"


class LaneNotRunning(LaneError):
    """The lane does not answer, so no gate can run."""

    code = "lane-not-running"


class EngineUnreachable(LaneError):
    """The engine does not answer (not running, wrong port, or stalled past the deadline)."""

    code = "engine-unreachable"


class EngineRefused(LaneError):
    """The engine answered a request with an error."""

    code = "engine-refused"


class RankNotAsleep(LaneError):
    """A worker's rank of a lane over several hosts did not fall asleep with its head."""

    code = "rank-not-asleep"


class PeerUnreachable(LanedError):
    """Another host's laned (a rank of a lane over several hosts) does not answer, or refuses."""

    code = "peer-unreachable"


class ApiUnavailable(LanedError):
    """laned's API does not answer."""

    code = "api-unavailable"


class ApiRefused(LanedError):
    """laned answered with an error envelope."""

    def __init__(
        self, status: int, code: str, message: str, hint: str, findings: list[Any] | None = None
    ) -> None:
        super().__init__(message, hint)
        self.status, self.code = status, code
        self.findings = findings or []


class NotAContainer(LaneError):
    """Something only a container lane has was asked of a lane that runs no container."""

    code = "not-a-container"


class EngineBrokeOff(LaneError, ConnectionError):
    """The engine's answer ended before its end: it closed the connection, sent bytes that
    are not HTTP, or the answer was given up. A ConnectionError too, as any broken
    connection is to the code that sends requests."""

    code = "engine-broke-off"
