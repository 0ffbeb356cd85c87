"""The systemd user manager over D-Bus (dbus-fast, asyncio): thin typed calls and signals.

One method per systemd call. Jobs are waited for without races: JobRemoved is
subscribed to before any job is dispatched, and a JobRemoved that arrives before the
StartUnit reply is kept until the caller asks for it. PropertiesChanged on unit objects
is delivered to a callback as plain Python values, so an exit status is captured even
when systemd garbage-collects the unit right after. D-Bus errors become SystemdError.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
from collections import OrderedDict
from collections.abc import Callable
from enum import Enum
from typing import Any

from dbus_fast import BusType, Message, MessageType
from dbus_fast.aio import MessageBus
from dbus_fast.errors import DBusError

from laned.adapters import commands
from laned.core.unit_state import UnitCallback, UnitSnapshot
from laned.errors import BusUnavailable, CommandFailed, SystemdError

log = logging.getLogger("laned.systemd")

SYSTEMD = "org.freedesktop.systemd1"
PATH = "/org/freedesktop/systemd1"
MANAGER = "org.freedesktop.systemd1.Manager"
UNIT = "org.freedesktop.systemd1.Unit"
SERVICE = "org.freedesktop.systemd1.Service"
PROPERTIES = "org.freedesktop.DBus.Properties"
UNIT_PREFIX = "/org/freedesktop/systemd1/unit/"


class BusError(str, Enum):
    """The D-Bus errors of systemd that laned answers to (others are SystemdError)."""

    NO_SUCH_UNIT = "org.freedesktop.systemd1.NoSuchUnit"
    ALREADY_SUBSCRIBED = "org.freedesktop.systemd1.AlreadySubscribed"


class JobMode(str, Enum):
    """How a new job treats queued jobs (systemd's own words)."""

    REPLACE = "replace"
    FAIL = "fail"


def unit_name_from_path(path: str) -> str:
    """Undo systemd's object-path escaping: /org/.../unit/dsv41_2eservice -> dsv41.service."""
    escaped = path.removeprefix(UNIT_PREFIX)
    return re.sub(r"_([0-9a-f]{2})", lambda m: chr(int(m.group(1), 16)), escaped)


def installed_version() -> int | None:
    """The version of the installed systemd (`systemctl --version`), None when unknown."""
    systemctl = shutil.which("systemctl")
    if not systemctl:
        return None
    try:
        out = commands.run([systemctl, "--version"], timeout=10)
    except CommandFailed:
        return None
    match = re.match(r"systemd (\d+)", out)
    return int(match.group(1)) if match else None


def bus_address(env: dict[str, str] | None = None) -> str:
    """The user bus: $DBUS_SESSION_BUS_ADDRESS, else $XDG_RUNTIME_DIR/bus."""
    env = dict(os.environ) if env is None else env
    if env.get("DBUS_SESSION_BUS_ADDRESS"):
        return env["DBUS_SESSION_BUS_ADDRESS"]
    runtime = env.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
    return f"unix:path={runtime}/bus"


class Systemd:
    """A connection to the user manager. Call `connect()` first; `closed` completes on disconnect."""

    def __init__(self, address: str | None = None) -> None:
        self.address = address or bus_address()
        self.bus: MessageBus | None = None
        self.on_unit_change: UnitCallback | None = None
        self.on_manager_restart: Callable[[], None] | None = None
        # Several callers may wait on one job: systemd returns the same job path when it
        # merges a request into a job already queued for the unit.
        self._waiting: dict[str, list[asyncio.Future[str]]] = {}
        self._finished: OrderedDict[str, str] = OrderedDict()

    async def connect(self) -> None:
        """Connect, subscribe to systemd's signals and install the match rules."""
        try:
            self.bus = await MessageBus(
                bus_address=self.address, bus_type=BusType.SESSION
            ).connect()
        except (OSError, DBusError, ValueError) as exc:
            raise BusUnavailable(
                f"cannot reach the user bus at {self.address}: {exc}",
                "is a systemd user manager running? (XDG_RUNTIME_DIR and DBUS_SESSION_BUS_ADDRESS must point at it)",
            ) from exc
        self.bus.add_message_handler(self._on_message)
        for rule in (
            f"type='signal',sender='{SYSTEMD}',interface='{MANAGER}',member='JobRemoved'",
            f"type='signal',sender='{SYSTEMD}',interface='{PROPERTIES}',member='PropertiesChanged',"
            f"path_namespace='{PATH}/unit'",
            f"type='signal',sender='org.freedesktop.DBus',member='NameOwnerChanged',arg0='{SYSTEMD}'",
        ):
            await self._call(
                "AddMatch",
                "s",
                [rule],
                "/org/freedesktop/DBus",
                "org.freedesktop.DBus",
                "org.freedesktop.DBus",
            )
        await self.subscribe()

    async def wait_closed(self) -> None:
        """Return when the bus connection is gone, however it went; jobs still being waited
        for then fail with BusUnavailable (their JobRemoved can no longer arrive)."""
        if self.bus is not None:
            # dbus-fast re-raises what ended the connection (EOFError, OSError, an unmarshalling
            # error): it ended, and what ended it is said (the owner logs the loss itself).
            try:
                await self.bus.wait_for_disconnect()  # type: ignore[no-untyped-call]
            except Exception as exc:
                log.warning("the user bus connection ended: %s: %s", type(exc).__name__, exc)
        self._fail_waiting(
            BusUnavailable("the user bus connection was lost", "laned reconnects by itself")
        )

    def disconnect(self) -> None:
        """Close the connection."""
        if self.bus is not None:
            self.bus.disconnect()
        self._fail_waiting(
            BusUnavailable("the user bus connection was lost", "laned reconnects by itself")
        )

    def _fail_waiting(self, error: BusUnavailable) -> None:
        for futures in self._waiting.values():
            for future in futures:
                if not future.done():
                    future.set_exception(error)
        self._waiting.clear()

    # --- one method per systemd call ---------------------------------------------------

    async def subscribe(self) -> None:
        """Subscribe(): ask systemd to emit JobRemoved and PropertiesChanged.

        AlreadySubscribed means this connection's subscription stands: that is success."""
        try:
            await self._call("Subscribe")
        except SystemdError as exc:
            if exc.name != BusError.ALREADY_SUBSCRIBED:
                raise

    async def reload(self) -> None:
        """Reload(): daemon-reload, so that rewritten unit files take effect."""
        await self._call("Reload")

    async def version(self) -> int | None:
        """The manager's Version property as a number (e.g. 252)."""
        body = await self._call("Get", "ss", [MANAGER, "Version"], PATH, PROPERTIES)
        match = re.match(r"(\d+)", str(body[0].value))
        return int(match.group(1)) if match else None

    async def system_state(self) -> str:
        """The manager's SystemState: running, degraded, stopping, ..."""
        body = await self._call("Get", "ss", [MANAGER, "SystemState"], PATH, PROPERTIES)
        return str(body[0].value)

    async def manager_started(self) -> int:
        """When the manager started (UserspaceTimestampMonotonic, µs): kept across a re-exec,
        new for a manager started again, which knows nothing of what the one before ran."""
        body = await self._call(
            "Get", "ss", [MANAGER, "UserspaceTimestampMonotonic"], PATH, PROPERTIES
        )
        return int(body[0].value)

    async def load_unit(self, name: str) -> str:
        """LoadUnit(): the unit's object path (loads it if needed)."""
        return str((await self._call("LoadUnit", "s", [name], unit=name))[0])

    async def ref_unit(self, name: str) -> None:
        """Ref() on the unit, so systemd keeps it (and its exit status) loaded while laned runs."""
        path = await self.load_unit(name)
        await self._call("Ref", "", [], path, UNIT, unit=name)

    async def start_unit(self, name: str, mode: JobMode = JobMode.REPLACE) -> str:
        """StartUnit() and wait for the job: systemd's result word ("done", "failed", ...)."""
        return await self._job("StartUnit", name, mode)

    async def stop_unit(self, name: str, mode: JobMode = JobMode.REPLACE) -> str:
        """StopUnit() and wait for the job."""
        return await self._job("StopUnit", name, mode)

    async def restart_unit(self, name: str, mode: JobMode = JobMode.REPLACE) -> str:
        """RestartUnit() and wait for the job."""
        return await self._job("RestartUnit", name, mode)

    async def enable_unit_files(self, paths: list[str]) -> None:
        """EnableUnitFiles(): what `systemctl --user enable` does (persistent, replacing links)."""
        await self._call("EnableUnitFiles", "asbb", [paths, False, True])

    async def reset_failed_unit(self, name: str) -> None:
        """ResetFailedUnit(): clear the failed state (and the start-limit counter)."""
        try:
            await self._call("ResetFailedUnit", "s", [name], unit=name)
        except SystemdError as exc:
            if exc.name != BusError.NO_SUCH_UNIT:
                raise

    async def snapshot(self, name: str) -> UnitSnapshot:
        """The unit's current state (GetAll on its Unit and Service interfaces)."""
        path = await self.load_unit(name)
        props: dict[str, Any] = {}
        for interface in (UNIT, SERVICE):
            body = await self._call("GetAll", "s", [interface], path, PROPERTIES, unit=name)
            props.update({k: v.value for k, v in body[0].items()})
        return UnitSnapshot(name).update(props)

    # --- plumbing -----------------------------------------------------------------------

    async def _job(self, method: str, name: str, mode: JobMode) -> str:
        path = str((await self._call(method, "ss", [name, mode.value], unit=name))[0])
        if path in self._finished:  # JobRemoved came before the reply
            return self._finished[path]
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(path, []).append(future)
        try:
            return await future
        finally:
            waiters = self._waiting.get(path, [])
            if future in waiters:
                waiters.remove(future)
            if not waiters:
                self._waiting.pop(path, None)

    async def _call(
        self,
        member: str,
        signature: str = "",
        body: list[Any] | None = None,
        path: str = PATH,
        interface: str = MANAGER,
        destination: str = SYSTEMD,
        unit: str = "",
    ) -> list[Any]:
        if self.bus is None or not self.bus.connected:
            raise BusUnavailable(
                "not connected to the user bus", "laned reconnects by itself; try again"
            )
        message = Message(
            destination=destination,
            path=path,
            interface=interface,
            member=member,
            signature=signature,
            body=body or [],
        )
        try:
            reply = await self.bus.call(message)
        except (OSError, EOFError) as exc:
            raise BusUnavailable(f"the user bus connection failed during {member}: {exc}") from exc
        if reply is None:
            raise SystemdError(f"{member}: no reply from systemd")
        if reply.message_type == MessageType.ERROR:
            text = reply.body[0] if reply.body else ""
            where = f" {unit}" if unit else ""
            hint = ""
            if reply.error_name == BusError.NO_SUCH_UNIT:
                hint = "run `laned render` and `systemctl --user daemon-reload`"
            raise SystemdError(
                f"{member}{where}: {text} ({reply.error_name})", hint, reply.error_name or ""
            )
        return list(reply.body)

    def _on_message(self, message: Message) -> None:
        if message.message_type != MessageType.SIGNAL:
            return
        if message.member == "JobRemoved" and message.interface == MANAGER:
            _job_id, path, _unit, result = message.body
            for future in self._waiting.pop(path, []):
                if not future.done():
                    future.set_result(result)
            # Kept for a caller whose reply has not been read yet (systemd numbers jobs
            # upwards, so a path is not reused soon).
            self._finished[path] = result
            while len(self._finished) > 256:
                self._finished.popitem(last=False)
        elif message.member == "PropertiesChanged" and (message.path or "").startswith(UNIT_PREFIX):
            interface, changed, _invalidated = message.body
            if interface in (UNIT, SERVICE) and self.on_unit_change is not None:
                values = {k: v.value for k, v in changed.items()}
                self.on_unit_change(unit_name_from_path(message.path or ""), values)
        elif (
            message.member == "NameOwnerChanged"
            and message.body
            and message.body[0] == SYSTEMD
            and message.body[2]
            and self.on_manager_restart is not None
        ):
            # The manager was re-executed: its subscription is gone until we subscribe again.
            self.on_manager_restart()
