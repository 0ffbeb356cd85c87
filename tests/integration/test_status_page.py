"""The status page in headless Chromium (Debian's chromium, driven by Playwright's Python API
with executable_path: no browser download, and the same API the probe of these machines
used), in four states — idle, a swap in progress, a sleeping lane, a crash loop — each
asserted on what is shown (states, rungs, the progress bar, the cold-start waterfall, the
GPUs' note, the timeline with its failure, the log), moved live from the page (SSE, no
reload); a cross-site request is refused. A screenshot of each state goes to the test's
tmp dir, and to docs/images/ with LANED_UPDATE_SCREENSHOTS=1 (the README shows them)."""

from __future__ import annotations

import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import ROOT, free_port, wait_until
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import FAST, lane_config

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# As the machines' probe starts it: no sandbox as root, and nothing that reaches the network.
FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


@pytest.fixture
def laned_api(harness: Harness, units: Units, tmp_path: Path) -> Iterator[str]:
    """`laned serve` over three simulator lanes: `a` (it sleeps at level 2) and `b` of one
    group with a 2 s cold start each, and `c`, of a group of its own, which dies at start."""
    lanes = {
        "a": FAST + "sleep_level = 2\n",
        "b": FAST,
        "c": FAST + 'group = "c"\ngpus = []\nstart_limit_burst = 1\n',
    }
    env = {
        "a": {"LANED_SIM_STARTUP": "2"},
        "b": {"LANED_SIM_STARTUP": "2", "LANED_SIM_READ_WEIGHTS": "1"},
        "c": {"LANED_SIM_FAIL_AT_START": "3"},
    }
    ports = {name: free_port() for name in lanes}
    lane_config(harness, units, tmp_path, lanes, 0, env=env, ports=ports)
    # b's weights: one real file of 8 MiB (the page shows how much of it is cached).
    (tmp_path / "models" / "b" / "model.safetensors").write_bytes(os.urandom(8 * 2**20))
    api = free_port()
    config = tmp_path / "laned.toml"
    config.write_text(config.read_text().replace('"127.0.0.1:1"', f'"127.0.0.1:{api}"'))
    log = tmp_path / "laned.log"
    with log.open("wb") as out:
        laned = subprocess.Popen(
            [sys.executable, "-m", "laned", "--config", str(config), "serve"],
            env=harness.env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{api}"
    try:
        wait_until(lambda: httpx.get(url + "/healthz").status_code == 200, 60, "laned's API")
        yield url
    finally:
        laned.terminate()
        laned.wait(30)
        if os.environ.get("LANED_KEEP_LOGS"):
            print(log.read_text())


def shoot(page: Any, tmp_path: Path, name: str) -> None:
    """A screenshot of the page as it is, kept in the test's tmp dir (and in docs/images/
    with LANED_UPDATE_SCREENSHOTS=1)."""
    path = tmp_path / f"status-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000
    if os.environ.get("LANED_UPDATE_SCREENSHOTS"):
        shutil.copy(path, ROOT / "docs" / "images" / path.name)


def test_the_status_page_shows_the_host_in_four_states_and_swaps_live(
    laned_api: str, tmp_path: Path
) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    expect = sync_api.expect
    if not os.path.exists(CHROMIUM):
        pytest.fail("chromium is missing (apt-get install chromium; scripts/install does)")
    with sync_api.sync_playwright() as play:
        browser = play.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(laned_api + "/")
            row = {lane: page.locator(f'tr[data-lane="{lane}"]') for lane in "abc"}
            state = {lane: row[lane].locator(".state") for lane in "abc"}
            rung = {lane: row[lane].locator(".rung") for lane in "abc"}

            # 1. Idle: every lane stopped; no GPU here, and the page says why.
            for lane in "abc":
                expect(state[lane]).to_have_text("inactive")
                expect(rung[lane]).to_contain_text("stopped")
            expect(page.locator("#live")).to_have_text("live")
            expect(row["a"].locator(".engine-name")).to_have_text(
                "vllm · a"
            )  # its engine, its model
            expect(page.locator("#gpus")).to_contain_text("no GPU read: ")
            expect(page.locator('#timeline .band[data-group="gpus"]')).to_have_attribute("aria-label", "nothing ran")  # fmt: skip
            expect(page.locator('#cache [data-cache="b"]')).to_contain_text("b · 8 MiB of 8 MiB (100%) · 1 file")  # fmt: skip
            shoot(page, tmp_path, "idle")

            # 2. A swap in progress: a from the page, then b (a goes to sleep).
            row["a"].locator('button[data-action="activate"]').click()
            expect(state["a"]).to_have_text("starting", timeout=10_000)
            expect(row["a"].locator(".bar")).to_be_visible()
            expect(state["a"]).to_have_text("ready", timeout=30_000)
            expect(rung["a"]).to_contain_text("running")
            falls = page.locator('#falls .fall[data-lane="a"]')
            expect(falls).to_contain_text("loading weights")  # its cold start, phase by phase
            row["b"].locator('button[data-action="activate"]').click()
            expect(state["b"]).to_have_text("starting", timeout=10_000)
            expect(row["b"].locator(".bar")).to_be_visible()
            shoot(page, tmp_path, "swap")

            # 3. A sleeping lane: a asleep, b serving; the timeline has a's time on the GPUs.
            expect(state["a"]).to_have_text("sleeping", timeout=30_000)
            expect(rung["a"]).to_contain_text("asleep")
            expect(state["b"]).to_have_text("ready", timeout=30_000)
            expect(page.locator('#timeline .band[data-group="gpus"] div[data-lane="a"]').first).to_be_attached(timeout=70_000)  # fmt: skip
            events = page.locator("#events")
            expect(events).to_contain_text("b  inactive → starting")
            expect(events).to_contain_text("a  ready → stopping")
            # b's cold start says how much of its weights the page cache held as it began.
            expect(page.locator('#falls [data-warm="b"]')).to_contain_text("weights in the page cache as it started: ")  # fmt: skip
            page.locator("#log-lane").select_option("b")
            expect(page.locator("#log")).to_contain_text("Application startup complete", timeout=10_000)  # fmt: skip
            shoot(page, tmp_path, "sleeping")

            # 4. A crash loop: c dies at start; failed, and the timeline marks it.
            row["c"].locator('button[data-action="activate"]').click()
            expect(state["c"]).to_have_text("failed", timeout=30_000)
            expect(row["c"]).to_contain_text("crash-loop")
            band = page.locator('#timeline .band[data-group="c"]')
            expect(band.locator(".fail").first).to_be_attached(timeout=70_000)
            expect(band).to_have_attribute("aria-label", re.compile("c (failed|restarting) at "))
            shoot(page, tmp_path, "crash-loop")

            # The buttons are reached by keyboard: Tab lands on one, named for its lane.
            page.keyboard.press("Tab")
            for _ in range(30):
                focused = page.evaluate("document.activeElement.getAttribute('aria-label') || ''")
                if focused:
                    break
                page.keyboard.press("Tab")
            assert re.fullmatch(r"(activate|deactivate|restart) [abc]", focused), focused

            # A page of another site posts to laned: refused by the guard, nothing changes.
            other = _serve_page(
                tmp_path,
                f'<script>fetch("{laned_api}/lanes/a/activate", '
                '{method: "POST", mode: "no-cors"}).then(() => document.title = "sent")</script>',
            )
            evil = browser.new_page()
            with evil.expect_response(lambda r: "/lanes/a/activate" in r.url) as answer:
                evil.goto(other)
            assert answer.value.status == 403
            lanes = {v["name"]: v for v in httpx.get(laned_api + "/lanes").json()["lanes"]}
            assert lanes["a"]["desired"] == "inactive" and lanes["b"]["state"] == "ready"
        finally:
            browser.close()


def _serve_page(tmp_path: Path, html: str) -> str:
    """A page on another origin (localhost, another port): a cross-site caller."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(html)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*args, directory=str(site), **kwargs)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://localhost:{server.server_address[1]}/index.html"


def test_status_watch_redraws_until_stopped(laned_api: str) -> None:
    """`laned status --watch`: a table again every interval, plain when not on a terminal."""
    watch = subprocess.Popen(
        [sys.executable, "-m", "laned", "status", "--url", laned_api, "--watch", "0.2"],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    assert watch.stdout is not None
    seen = 0
    try:
        for line in watch.stdout:
            seen += line.startswith("LANE ")
            assert "\033[" not in line, "colour on a pipe"
            if seen == 3:
                break
    finally:
        watch.terminate()
        watch.wait(10)
        watch.stdout.close()
    assert seen == 3


def test_gpus_say_which_lanes_engine_holds_each_processs_memory(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    """GET /gpus (the page's GPU panel) over NVML's readings: the engine's process is named
    by its lane (from the unit's cgroup), a stranger's is not."""
    from laned.adapters.host import Host
    from laned.adapters.podman import Podman
    from laned.core.facts import GIB, GpuReading
    from tests.integration.test_api import api_server
    from tests.integration.test_supervisor import run

    port, api_port = free_port(), free_port()
    config = lane_config(harness, units, tmp_path, {"a": FAST}, port)

    class Gpu:
        def read(self, indices: Any = None) -> list[GpuReading]:
            pid = int(harness.show(f"{units.name('a')}.service", "MainPID")["MainPID"])
            # A stranger's process too, once a runs (before, the GPU gate would wait on it).
            held = ((pid, 70 * GIB), (4242, 2 * GIB)) if pid else ()
            return [GpuReading(0, "test GPU", 80 * GIB, sum(b for _, b in held), held)]

        def survey(self, indices: Any = None) -> tuple[list[GpuReading], list[str]]:
            return self.read(indices), []  # every GPU read (Nvml.survey)

        def close(self) -> None:
            pass

    host = Host(Podman(harness.env["LANED_PODMAN_SOCKET"]), Gpu())  # type: ignore[arg-type]

    async def scenario() -> None:
        async with (
            api_server(harness, config, api_port, host=host) as sup,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{api_port}", timeout=30) as client,
        ):
            await sup.activate("a")
            body = (await client.get("/gpus")).json()
            assert body["note"] is None
            [gpu] = body["gpus"]
            owners = {p["pid"]: p["lane"] for p in gpu["processes"]}
            assert owners.pop(4242) is None and list(owners.values()) == ["a"], owners
            assert gpu["total_bytes"] == 80 * GIB and gpu["name"] == "test GPU"
            timeline = (await client.get("/timeline", params={"hours": 1})).json()
            assert timeline["groups"] == {"gpus": ["a"]}
            moves = [(t["from"], t["to"]) for t in timeline["transitions"] if t["lane"] == "a"]
            assert moves == [("inactive", "starting"), ("starting", "ready")], moves
            too_far = await client.get("/timeline", params={"hours": 25})
            assert too_far.status_code == 400 and "hours" in too_far.text, too_far.text

    run(scenario())
