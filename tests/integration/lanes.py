"""Lane configs for integration tests: simulator lanes rendered into the harness's user manager."""

from __future__ import annotations

import sys
from pathlib import Path

from laned.adapters import rendered
from laned.validation.load import Config, parse_config
from tests.integration.conftest import Harness, Units

FAST = 'restart_sec = "200ms"\nprobe = { interval = "200ms", start_interval_min = "50ms", start_interval_max = "200ms" }\n'


def lane_config(
    harness: Harness,
    units: Units,
    tmp: Path,
    lanes: dict[str, str],
    port: int,
    daemon: str = "",
    env: dict[str, dict[str, str]] | None = None,
    ports: dict[str, int] | None = None,
) -> Config:
    """Render lanes (name -> extra lane-level TOML) into the harness's unit dir; daemon-reload.

    Lanes without a [lanes.X.container] or [lanes.X.exec] table run the simulator as exec lanes, with a short
    cold start unless `env` says otherwise. Unit names are unique to the test (Units.name).
    """
    text = (
        f'[daemon]\nunit_dir = "{harness.unit_dir}"\nbin_dir = "{tmp}/bin"\nstate_dir = "{tmp}/state"\n'
        # Every folder named: a reload reads the file with laned's own environment.
        + ("" if "cache_dir =" in daemon else f'cache_dir = "{tmp}/cache"\n')
        + ("" if "listen =" in daemon else 'listen = "127.0.0.1:1"\n')
        + f"{daemon}\n"
    )
    for name, extra in lanes.items():
        text += (
            f'[lanes.{name}]\nunit = "{units.name(name)}.service"\nport = {(ports or {}).get(name, port)}\nserved_model_name = "{name}"\n'
            + ("" if "stop_timeout" in extra else 'stop_timeout = "20s"\n')
            + f"{extra}\n"
        )
        if "restart_sec" not in extra:
            text += 'restart_sec = "1s"\n'
        if f"[lanes.{name}.container]" not in extra and f"[lanes.{name}.exec]" not in extra:
            # A real model directory: preflight checks that it exists.
            (tmp / "models" / name).mkdir(parents=True, exist_ok=True)
            text += f'[lanes.{name}.exec]\ncommand = ["{sys.executable}", "-m", "laned", "sim", "serve", "{tmp}/models/{name}"]\n'
            lane_env = {"LANED_SIM_STARTUP": "0.3", **(env or {}).get(name, {})}
            text += f"[lanes.{name}.env]\n" + "".join(f'{k} = "{v}"\n' for k, v in lane_env.items())
        units.track(f"{units.name(name)}.service")
    (tmp / "laned.toml").write_text(text)  # for tests that run `laned serve` on it
    config = parse_config(text, str(tmp / "laned.toml"), {"HOME": str(tmp)})
    rendered.apply(config)
    harness.systemctl("daemon-reload")
    return config
