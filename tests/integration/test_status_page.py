"""The status page in headless Chromium (Debian's chromium, driven by Playwright's Python API
with executable_path: no browser download, and the same API the probe of these machines
used): it loads, shows both lanes, a swap started from the page moves state and progress
live (SSE, no reload), a cross-site request is refused. A screenshot goes to the test's tmp
dir."""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

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
    """`laned serve` over two simulator lanes of one group (a 2 s cold start each)."""
    slow = {"a": {"LANED_SIM_STARTUP": "2"}, "b": {"LANED_SIM_STARTUP": "2"}}
    lane_config(harness, units, tmp_path, {"a": FAST, "b": FAST}, free_port(), env=slow)
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


def test_the_status_page_shows_the_lanes_and_swaps_them_live(
    laned_api: str, tmp_path: Path
) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.fail("chromium is missing (apt-get install chromium; scripts/install does)")
    with sync_api.sync_playwright() as play:
        browser = play.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page()
            page.goto(laned_api + "/")
            state = {lane: page.locator(f'tr[data-lane="{lane}"] .state') for lane in "ab"}
            for lane in "ab":
                state[lane].wait_for()
                assert state[lane].inner_text() == "inactive"
            sync_api.expect(page.locator("#live")).to_have_text("live")

            # Activate a from the page, then swap to b: both move without a reload.
            page.locator('tr[data-lane="a"] button').click()
            sync_api.expect(state["a"]).to_have_text("starting", timeout=10_000)
            bar = page.locator('tr[data-lane="a"] .bar')
            sync_api.expect(bar).to_be_visible()
            sync_api.expect(state["a"]).to_have_text("ready", timeout=30_000)
            page.locator('tr[data-lane="b"] button').click()
            sync_api.expect(state["b"]).to_have_text("starting", timeout=10_000)
            sync_api.expect(state["a"]).to_have_text("inactive", timeout=30_000)
            sync_api.expect(state["b"]).to_have_text("ready", timeout=30_000)
            events = page.locator("#events")
            sync_api.expect(events).to_contain_text("b  inactive → starting")
            sync_api.expect(events).to_contain_text("a  ready → stopping")
            page.screenshot(path=str(tmp_path / "status-page.png"), full_page=True)
            assert (tmp_path / "status-page.png").stat().st_size > 10_000

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
