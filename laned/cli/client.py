"""The CLI's side of the control API: requests, the error envelope, the status table."""

from __future__ import annotations

import sys
import time
from typing import Any

import httpx

from laned.errors import ApiRefused, ApiUnavailable


class Client:
    """A synchronous client of laned's control API."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    def call(self, method: str, path: str, **params: Any) -> dict[str, Any]:
        """One request; the envelope becomes ApiRefused, no answer ApiUnavailable."""
        try:
            response = self.http.request(
                method, path, params={k: v for k, v in params.items() if v is not None}
            )
        except httpx.TransportError as exc:
            raise ApiUnavailable(
                f"laned does not answer at {self.url} ({exc})",
                "is it running? (systemctl --user status laned; or pass --url)",
            ) from exc
        try:
            body: dict[str, Any] = response.json()
        except ValueError:
            raise ApiUnavailable(
                f"{self.url}{path} did not answer JSON (status {response.status_code})"
            ) from None
        if response.status_code >= 400:
            error = body.get("error", {})
            raise ApiRefused(
                response.status_code,
                error.get("code", "?"),
                error.get("message", ""),
                error.get("hint", ""),
                error.get("findings"),
            )
        return body


def _checks_cell(checks: dict[str, Any] | None) -> str:
    """`5/6 (speed)`: gates passed at the last run, and the first that failed."""
    if not checks or not checks.get("gates"):
        return "-"
    gates = checks["gates"]
    failed = [g for g, r in gates.items() if not r["passed"]]
    cell = f"{len(gates) - len(failed)}/{len(gates)}"
    return cell + (f" ({failed[0]} failed)" if failed else "")


def _requests_cell(counts: dict[str, float] | None) -> str:
    """`2 in flight, 3 queued (oldest 41 s)`: the lane's requests at laned's OpenAI endpoint."""
    if not counts or not (counts.get("in_flight") or counts.get("queued")):
        return "-"
    cell = f"{counts['in_flight']:.0f} in flight, {counts['queued']:.0f} queued"
    oldest = counts.get("oldest_wait")
    return cell + (f" (oldest {oldest:.0f} s)" if counts["queued"] and oldest else "")


COLOURS = {  # ANSI: the status page's colours, as a terminal has them
    "ready": "32", "degraded": "33", "failed": "31;1", "inactive": "2",
    "starting": "34", "stopping": "34", "restarting": "34", "sleeping": "35",
}  # fmt: skip


def ready_in_cell(lane: dict[str, Any]) -> str:
    """How long an activation would take from where the lane is, as measured last time: a
    wake for a sleeping lane, a cold start for a stopped one; "-" serving or not measured."""
    seconds = lane.get("ready_in")
    if not seconds:
        return "-"
    shown = f"{seconds:.1f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
    return f"~{shown} ({'wake' if lane['state'] == 'sleeping' else 'cold start'})"


def weights_cell(lane: dict[str, Any]) -> str:
    """The lane's weight-cache daemon: its state and the GPU memory it holds; "-" for none."""
    cache = lane.get("weight_cache")
    if not cache:
        return "-"
    held = cache.get("held_bytes")
    return str(cache["state"]) + (f" {held / 2**30:.1f} GiB" if held else "")


def table(lanes: list[dict[str, Any]], colour: bool = False) -> str:
    """The `laned status` table (its state column coloured, for a terminal); WEIGHTS where a
    lane keeps its weights in a weight-cache daemon."""
    cached = any(lane.get("weight_cache") for lane in lanes)
    rows = [
        (
            "LANE",
            "STATE",
            "DESIRED",
            "PORT",
            "ENGINE",
            "MODEL",
            "REQUESTS",
            "RESTARTS",
            "CHECKS",
            "READY IN",
            *(("WEIGHTS",) if cached else ()),
            "REASON",
        )
    ]
    for lane in lanes:
        state = lane["state"]
        if lane.get("phase"):
            notes = ((lane.get("startup") or {}).get("notes")) or []
            state += (
                f" ({lane['phase']}"
                + (f" {lane['progress']:.0f}%" if lane.get("progress") is not None else "")
                + "".join(f"; {note}" for note in notes)
                + ")"
            )
        rows.append(
            (
                lane["name"],
                state,
                lane["desired"],
                str(lane["port"]),
                lane.get("engine_name") or "-",
                lane["served_model_name"],
                _requests_cell(lane.get("proxy")),
                str(lane["restarts"]),
                _checks_cell(lane.get("checks")),
                ready_in_cell(lane),
                *((weights_cell(lane),) if cached else ()),
                lane.get("reason") or "",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]

    def paint(row: int, column: int, text: str) -> str:
        if not colour or row == 0 or column != 1:
            return text
        code = COLOURS.get(lanes[row - 1]["state"])
        return f"\033[{code}m{text}\033[0m" if code else text

    return "\n".join(
        "  ".join(
            paint(r, i, cell.ljust(w)) for i, (cell, w) in enumerate(zip(row, widths, strict=False))
        )
        + "  "
        + row[-1]
        for r, row in enumerate(rows)
    )


def findings_text(body: dict[str, Any]) -> str:
    """`laned preflight` output: one line a finding with its hint, and the verdict."""
    lines = []
    for f in body["findings"]:
        lines.append(f"{f['severity']:7}  {f['check']:13}  {f['message']}")
        if f.get("hint"):
            lines.append(f"{'':7}  {'':13}  hint: {f['hint']}")
    errors = sum(1 for f in body["findings"] if f["severity"] == "error")
    verdict = "ok: it would start" if body["ok"] else f"refused: {errors} error(s) block activation"
    lines.append(f"{body['lane']}: {verdict}")
    return "\n".join(lines)


def checks_text(run: dict[str, Any]) -> str:
    """`laned check` output: a line a gate, with what it measured or why it failed."""
    lines = []
    ran = run.get("ran") or list(run["gates"])
    shown = {gate: run["gates"][gate] for gate in ran}
    for gate, result in shown.items():
        mark = "pass" if result["passed"] else "FAIL"
        measured = {k: v for k, v in (result.get("measured") or {}).items() if k != "answer"}
        detail = result.get("reason") or ", ".join(f"{k} {v}" for k, v in measured.items())
        lines.append(f"{mark}  {gate:10} {result.get('seconds', 0):7.1f}s  {detail}")
    passed = sum(1 for r in shown.values() if r["passed"])
    lines.append(f"{run['lane']}: {passed}/{len(shown)} gates passed")
    return "\n".join(lines)


def checks_passed(run: dict[str, Any]) -> bool:
    """Whether the gates of this run (not earlier ones) all passed."""
    ran = run.get("ran") or list(run["gates"])
    return all(run["gates"][gate]["passed"] for gate in ran)


def fit_table(body: dict[str, Any]) -> str:
    """`laned status --fit`: the host, then each lane with whether it fits and why not."""
    host = body["host"]
    if host["gpus"] is None:
        gpus = f"GPUs unknown ({host['gpu_note']})"
    else:
        gpus = f"{len(host['gpus'])} GPU(s), " + ", ".join(
            f"{g['index']}: {g['name']} {g['total_gib']:.0f} GiB"
            + (
                f" unified ({g['total_gib'] - g['used_gib']:.0f} GiB free)"
                if g.get("unified")
                else ""
            )
            for g in host["gpus"]
        )
        gpus += f" ({host['gpu_note']})" if host.get("gpu_note") else ""
    memory = host.get("mem_total_gib")
    lines = [f"host: {gpus}; RAM {memory:.0f} GiB" if memory else f"host: {gpus}"]
    for lane in body["lanes"]:
        problems = [f["message"] for f in lane["findings"] if f["severity"] != "note"]
        notes = [f["message"] for f in lane["findings"] if f["severity"] == "note"]
        unsure = any(f["severity"] == "warning" for f in lane["findings"])
        verdict = "does not fit" if not lane["fits"] else "may not fit" if unsure else "fits"
        detail = "; ".join(problems or notes)
        lines.append(f"  {lane['name']:16} {verdict}" + (f"  ({detail})" if detail else ""))
    if "placement" in body:
        lines += placement_lines(body["placement"])
    return "\n".join(lines)


def placement_lines(placement: dict[str, Any]) -> list[str]:
    """Placement, for people: each GPU with the lanes placed on it and what is left, then
    each pair of lanes with whether they may run together and why (laned.core.placement)."""
    gib = 2**30
    lines = []
    if any(g["lanes"] for g in placement["gpus"]):
        lines.append("placed now:")
        for g in placement["gpus"]:
            where = f"GPU {g['index']}" if g["index"] >= 0 else "its GPUs"
            size = f" ({g['total_bytes'] / gib:.0f} GiB)" if g["total_bytes"] else ""
            who = ", ".join(
                (
                    f"{lane['name']} {lane['bytes'] / gib:.1f} GiB"
                    if lane["bytes"] is not None
                    else lane["name"]
                )
                + (" asleep" if lane.get("asleep") else "")
                for lane in g["lanes"]
            )
            left = f"; {g['left_bytes'] / gib:.1f} GiB left" if g["left_bytes"] is not None else ""
            lines.append(f"  {where}{size}: {who or 'nothing'}{left}")
    if placement["pairs"]:
        unknown = ""
        if not placement["gpus_known"]:
            unknown = " (GPU memory not read here: shares add up, GiB sizes cannot)"
        lines.append(f"which lanes may run together{unknown}:")
        for pair in placement["pairs"]:
            verdict = "together" if pair["together"] else "apart"
            lines.append(f"  {pair['a']:16} {pair['b']:16} {verdict:9} {pair['why']}")
    return lines


def follow_start(client: Client, lane: str, timeout: float | None) -> dict[str, Any]:
    """Poll the lane while it starts, showing a live progress line; return its final view."""
    started = time.monotonic()
    tty = sys.stderr.isatty()
    last_line = ""
    while True:
        view = client.call("GET", f"/lanes/{lane}")
        elapsed = time.monotonic() - started
        # An inactive lane that is still desired is waiting for its peer to stop (a swap).
        if view["state"] in ("ready", "failed") or (
            view["state"] == "inactive" and view["desired"] == "inactive"
        ):
            if tty:
                sys.stderr.write("\r\x1b[K")
            return view
        phase = view.get("phase") or view["state"]
        percent = f" {view['progress']:.0f}%" if view.get("progress") is not None else ""
        startup = view.get("startup") or {}
        kind = (
            "restart from the weight cache"
            if startup.get("kind") == "weight-cache"
            else "cold start"
        )
        expected = (
            f" (~{startup['remaining']:.0f}s left by the last {kind}, {startup['expected']:.0f}s)"
            if startup.get("remaining") is not None
            else f" (last cold start {view['last_cold_start']:.0f}s)"
            if view.get("last_cold_start")
            else ""
        )
        notes = "".join(f" [{note}]" for note in startup.get("notes") or [])
        line = f"{lane}: {phase}{percent}{notes}, {elapsed:.0f}s{expected}"
        if tty:
            sys.stderr.write("\r\x1b[K" + line)
        elif line.split(",")[0] != last_line.split(",")[0]:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
        last_line = line
        if timeout is not None and elapsed > timeout:
            raise ApiRefused(
                504,
                "timeout",
                f"lane {lane} is not ready after {timeout:g}s",
                "it goes on; see laned status",
            )
        time.sleep(0.5)
