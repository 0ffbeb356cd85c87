"""Test driver: a supervisor on $LANED_CONFIG that activates one lane, then idles until killed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys

from laned.adapters.probes import Probe
from laned.adapters.systemd import Systemd
from laned.errors import LanedError
from laned.owner.supervisor import Supervisor
from laned.owner.wiring import host_seam
from laned.validation.load import load_config


async def main(lane: str) -> None:
    config = load_config(os.environ["LANED_CONFIG"])
    supervisor = Supervisor(config, host_seam(Systemd(), Probe()), systemd_version=252)
    await supervisor.start()
    with contextlib.suppress(LanedError):
        await supervisor.activate(lane)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
