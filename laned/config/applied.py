"""How each setting is applied when the config is reloaded, declared on the field itself
(`listen: Annotated[str, RESTART]`), and what a reload changes by that declaration.

- LIVE: a reload applies it at once (the guard's token, the peers' token, the podman socket,
  the proxy's queue, a lane's aliases...);
- NEXT_START: a lane's engine keeps what it started with; the lane's next start applies it
  (a reload lists the running lanes it concerns in `restart_needed`);
- RESTART: only restarting laned applies it; a reload that changes it is refused (409).

Pure: the reload itself (laned.owner.supervisor, laned.api.daemon) acts on `changes`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel


class Applied(enum.Enum):
    LIVE = "live"
    NEXT_START = "next start"
    RESTART = "restart"


LIVE, NEXT_START, RESTART = Applied.LIVE, Applied.NEXT_START, Applied.RESTART


def applied_of(model: type[BaseModel], key: str) -> Applied:
    """How `model`'s field `key` is applied; LookupError for a field that declares nothing
    (every field of the daemon's and the lanes' tables declares it: the unit test holds it)."""
    for mark in model.model_fields[key].metadata:
        if isinstance(mark, Applied):
            return mark
    raise LookupError(f"{model.__name__}.{key} does not declare how a reload applies it")


@dataclass(frozen=True)
class Change:
    """One key a reload changes: `daemon.token_file`, `lanes.a.port`."""

    key: str
    applied: Applied
    lane: str | None = None


def changed_keys(
    model: type[BaseModel], old: BaseModel | None, new: BaseModel | None
) -> Iterator[str]:
    """The top-level fields of `model` whose values differ between `old` and `new` (every
    field when one of them is missing)."""
    for key in model.model_fields:
        if old is None or new is None or getattr(old, key) != getattr(new, key):
            yield key


def reload_lines(keys: Mapping[str, str], restart_needed: Sequence[str]) -> list[str]:
    """What a reload applied, as `laned reload` prints it and laned logs a SIGHUP's: the
    changed keys by how each was applied (POST /reload's `keys`), and the running lanes whose
    changes wait for their next start (its `restart_needed`)."""
    if not keys:
        return ["nothing changed"]
    lines = []
    for applied, said in ((LIVE, "applied now"), (NEXT_START, "at the lane's next start")):
        named = [key for key, value in keys.items() if value == applied.value]
        if named:
            lines.append(f"{said}: {', '.join(named)}")
    if restart_needed:
        lines.append(
            f"waiting for a restart: {', '.join(restart_needed)} (runs as it started until "
            "then; `laned restart LANE` applies it)"
        )
    return lines
