"""What laned knows of a lane's systemd unit, as plain data (no D-Bus): the pure core's view.

The systemd adapter fills these from GetAll and PropertiesChanged; policy reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

# A unit's PropertiesChanged as the systemd adapter hands it on: (unit, changed properties).
UnitCallback = Callable[[str, dict[str, Any]], None]

# ExecMainCode values (waitid's si_code): the process exited, or a signal ended it.
CLD_EXITED, CLD_KILLED, CLD_DUMPED = 1, 2, 3


class ActiveState(str, Enum):
    """A unit's ActiveState (systemd's own words)."""

    ACTIVE = "active"
    RELOADING = "reloading"
    INACTIVE = "inactive"
    FAILED = "failed"
    ACTIVATING = "activating"
    DEACTIVATING = "deactivating"


class Result(str, Enum):
    """A unit's Result: how its last run ended, in systemd's words (systemd.exec(5),
    `$SERVICE_RESULT`)."""

    SUCCESS = "success"
    TIMEOUT = "timeout"  # a start or stop outlived TimeoutStartSec=/TimeoutStopSec=: killed
    EXIT_CODE = "exit-code"
    SIGNAL = "signal"
    CORE_DUMP = "core-dump"
    WATCHDOG = "watchdog"
    START_LIMIT_HIT = "start-limit-hit"
    RESOURCES = "resources"
    OOM_KILL = "oom-kill"


# The unit holds (or is about to hold) its process: active, starting, reloading.
HOLDING = frozenset(
    {ActiveState.ACTIVE.value, ActiveState.ACTIVATING.value, ActiveState.RELOADING.value}
)
# SubStates after the main process has gone.
EXITED_SUBSTATES = frozenset({"dead", "failed", "auto-restart", "exited"})
AUTO_RESTART = "auto-restart"

_PROPERTIES = {
    "ActiveState": "active_state",
    "SubState": "sub_state",
    "Result": "result",
    "ExecMainCode": "exec_main_code",
    "ExecMainStatus": "exec_main_status",
    "NRestarts": "n_restarts",
    "ControlGroup": "control_group",
    "Job": "job",
}


@dataclass(frozen=True)
class UnitSnapshot:
    """The properties of a lane unit laned cares about."""

    name: str
    active_state: str = ActiveState.INACTIVE.value
    sub_state: str = "dead"
    result: str = Result.SUCCESS.value
    exec_main_code: int = 0
    exec_main_status: int = 0
    n_restarts: int = 0
    control_group: str = ""  # the unit's cgroup, under /sys/fs/cgroup
    job: int = 0  # the id of the job queued or running for it (0: none)

    @property
    def running(self) -> bool:
        """Active, starting or about to restart: the unit holds (or will hold) the GPUs."""
        return self.active_state in HOLDING or self.sub_state == AUTO_RESTART

    @property
    def ending(self) -> bool:
        """Running, its stop under way (deactivating), or a job queued for it: a start
        job sent by an operation a newer request superseded, which has not begun (the unit
        is still inactive) and would start it after a stop that looked only at its state."""
        running = self.running or self.active_state == ActiveState.DEACTIVATING.value
        return running or self.job != 0

    @property
    def exited(self) -> bool:
        """Its main process is gone (dead, failed, exited, or waiting to be restarted)."""
        return self.sub_state in EXITED_SUBSTATES

    def update(self, props: dict[str, Any]) -> UnitSnapshot:
        """A copy with changed properties applied."""
        values = dict(self.__dict__)
        for key, attr in _PROPERTIES.items():
            if key in props:
                value = props[key]
                if key == "Job":  # (id, object path); (0, "/") when none
                    value = int(value[0]) if isinstance(value, (list, tuple)) and value else 0
                values[attr] = value.hex() if isinstance(value, (bytes, bytearray)) else value
        return UnitSnapshot(**values)


# RestartSteps= and RestartMaxDelaySec= came with systemd 254: from there the user manager
# restarts a failed lane itself, with backoff; before, laned does.
RESTART_STEPS_SINCE = 254


def systemd_restarts(systemd_version: int) -> bool:
    """Whether a user manager of this version restarts a failed lane itself (its unit has
    Restart=on-failure with RestartSteps=), or laned does."""
    return systemd_version >= RESTART_STEPS_SINCE
