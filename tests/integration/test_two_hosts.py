"""A lane over two hosts, as seed 002 runs one: two laned, each in its own network namespace
(a veth pair between them, 10.77.x.1 and .2) with its own private systemd user manager, the
simulator as the head and the headless worker. Activated from the worker's host; the
worker's engine dies (status 0) and the lane comes back as one; the link is cut (degraded,
no restart for 15 s) and restored (ready); a one-host lane swaps the lane away on both.

All traffic stays inside the namespaces and their loopback."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, wait_until

TOKEN, PEER_TOKEN = "control-token-0123456789", "peer-token-9876543210"
CALL = (
    "import json, sys, httpx\n"
    "method, path, token = sys.argv[1:4]\n"
    "r = httpx.request(method, 'http://127.0.0.1:9000' + path, timeout=30,\n"
    "                  headers={'Authorization': 'Bearer ' + token})\n"
    "try:\n    body = r.json()\nexcept ValueError:\n    body = r.text\n"
    "print(json.dumps({'status': r.status_code, 'body': body}))\n"
)


# Where a process's cgroup is set: the hybrid hierarchies here, else the unified root.
CGROUP_ROOTS = [
    Path("/sys/fs/cgroup") / h
    for h in ("systemd", "unified")
    if (Path("/sys/fs/cgroup") / h / "cgroup.procs").exists()
] or [Path("/sys/fs/cgroup")]


@dataclass
class Host:
    name: str
    ns: str
    address: str
    harness: Path
    env: dict[str, str]
    laned: subprocess.Popen[bytes] | None = None

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            # nsenter, not `ip netns exec`: that one remounts /sys, and the user manager
            # then finds no cgroup hierarchy.
            ["nsenter", f"--net=/run/netns/{self.ns}", *argv],
            env=self.env, capture_output=True, text=True, check=check, timeout=60,
        )  # fmt: skip

    def api(self, method: str, path: str) -> dict[str, Any]:
        out = self.run(sys.executable, "-c", CALL, method, path, TOKEN)
        answer: dict[str, Any] = json.loads(out.stdout)
        return answer

    def lane(self, lane: str) -> dict[str, Any]:
        answer = self.api("GET", f"/lanes/{lane}")
        assert answer["status"] == 200, answer
        body: dict[str, Any] = answer["body"]
        return body


def ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, timeout=30)


def can_run() -> bool:
    """Network namespaces need root, iproute2 and nsenter."""
    return (
        os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("nsenter") is not None
    )


@pytest.fixture
def two_hosts() -> Iterator[tuple[Host, Host]]:
    if not can_run():
        pytest.skip("network namespaces need root, iproute2 and nsenter")
    with machines() as hosts:
        yield hosts


@contextlib.contextmanager
def machines() -> Iterator[tuple[Host, Host]]:
    """Two hosts, each in its own network namespace with its own user manager (the harness),
    a veth pair between them; all of it removed after (bench/two_hosts.py uses it too)."""
    tag = uuid.uuid4().hex[:6]
    hosts = []
    for i, name in enumerate(("host-a", "host-b")):
        harness = Path(f"/tmp/laned-2h-{tag}-{i}")
        env = {**os.environ, "LANED_HARNESS_DIR": str(harness)}
        hosts.append(Host(name, f"laned-{tag}-{i}", f"10.77.0.{i + 1}", harness, env))
    a, b = hosts
    try:
        for host in hosts:
            ip("netns", "add", host.ns)
        ip(
            "link",
            "add",
            f"v{tag}a",
            "netns",
            a.ns,
            "type",
            "veth",
            "peer",
            "name",
            f"v{tag}b",
            "netns",
            b.ns,
        )
        for host, dev in ((a, f"v{tag}a"), (b, f"v{tag}b")):
            ip("-n", host.ns, "addr", "add", f"{host.address}/24", "dev", dev)
            ip("-n", host.ns, "link", "set", dev, "up")
            ip("-n", host.ns, "link", "set", "lo", "up")
            # Each user manager in a cgroup of its own: two managers of one machine would
            # otherwise give their units the same cgroup (/app.slice/laned-w.service), and a
            # stop on one host would kill the other host's rank.
            cgroups = [root / host.ns for root in CGROUP_ROOTS]
            enter = "".join(f"mkdir -p {c} && echo $$ > {c}/cgroup.procs && " for c in cgroups)
            host.run("sh", "-c", enter + f'exec "{ROOT}/scripts/harness" up')
            exports = host.run(str(ROOT / "scripts" / "harness"), "env").stdout
            host.env.update(
                line.removeprefix("export ").split("=", 1) for line in exports.splitlines()
            )
        yield a, b
    finally:
        # Every step on its own: one that fails must not leave the others' processes behind.
        for host in hosts:
            if host.laned is not None and host.laned.poll() is None:
                host.laned.terminate()
                try:
                    host.laned.wait(30)
                except subprocess.TimeoutExpired:
                    host.laned.kill()
        for host in hosts:
            with contextlib.suppress(subprocess.TimeoutExpired):
                host.run(str(ROOT / "scripts" / "harness"), "down", check=False)
            subprocess.run(["ip", "netns", "del", host.ns], check=False, capture_output=True)
            for root in CGROUP_ROOTS:
                cgroup = root / host.ns
                for path in sorted(cgroup.glob("**/"), key=lambda p: -len(p.parts)):
                    with contextlib.suppress(OSError):
                        path.rmdir()
            shutil.rmtree(host.harness, ignore_errors=True)


def config(
    tmp: Path,
    host: Host,
    master: int,
    startup: float = 0.5,
    cached: float = 2.0,
    sleeps: bool = False,
) -> Path:
    """The one config both hosts share, but for daemon.host and where laned keeps its files:
    `w` (the simulator's start of `startup` s), `solo` on one host, and `wc`, as `w` but with
    its weights kept in each host's weight-cache daemon (a start of `cached` s). `sleeps`: `w`
    sleeps at level 1, on each host's simulated GPU (a 96 GiB one, its own), and the one-host
    lane has its own port (a sleeper keeps its own)."""
    home = tmp / host.name
    (home / "models").mkdir(parents=True, exist_ok=True)
    gpus = home / "gpus"
    gpus.mkdir(exist_ok=True)
    (gpus / "gpus.json").write_text(
        json.dumps({"gpus": [{"name": "sim", "total_bytes": 96 * 2**30}]})
    )
    on_gpus = f'LANED_SIM_GPUS = "{gpus}"\nLANED_SIM_WEIGHTS_GIB = "0.5"\n' if sleeps else ""
    for name, secret in (("token", TOKEN), ("peer-token", PEER_TOKEN)):
        (home / name).write_text(secret)
        (home / name).chmod(0o600)
    sim = f'"{sys.executable}", "-m", "laned", "sim", "serve", "{home}/models"'
    fast = 'restart_sec = "1s"\nprobe = { interval = "300ms", start_interval_min = "50ms", start_interval_max = "300ms" }\n'
    text = f"""
[daemon]
host = "{host.name}"
listen = "0.0.0.0:9000"
token_file = "{home}/token"
peer_token_file = "{home}/peer-token"
unit_dir = "{host.env["XDG_CONFIG_HOME"]}/systemd/user"
bin_dir = "{home}/bin"
state_dir = "{home}/state"

[lanes.w]
port = 8100
served_model_name = "w"
{"sleep_level = 1" if sleeps else ""}
{fast}nodes = [{{ host = "host-a", laned = "http://10.77.0.1:9000" }}, {{ host = "host-b", laned = "http://10.77.0.2:9000" }}]
values = {{ HEAD_IP = "10.77.0.1" }}
args = ["--nnodes", "${{NNODES}}", "--node-rank", "${{NODE_RANK}}", "--master-addr", "${{HEAD_IP}}", "--master-port", "{master}"]
[lanes.w.exec]
command = [{sim}]
[lanes.w.env]
LANED_SIM_STARTUP = "{startup}"
{on_gpus}[lanes.w.rank.1]
args = [{{ flag = "--headless" }}]

[lanes.wc]
port = 8200
served_model_name = "wc"
{fast}weight_cache = {{ health_port = 18200, master_port = {master + 20} }}
nodes = [{{ host = "host-a", laned = "http://10.77.0.1:9000" }}, {{ host = "host-b", laned = "http://10.77.0.2:9000" }}]
values = {{ HEAD_IP = "10.77.0.1" }}
args = ["--tensor-parallel-size", "2", "--nnodes", "${{NNODES}}", "--node-rank", "${{NODE_RANK}}", "--master-addr", "${{HEAD_IP}}", "--master-port", "{master + 10}"]
[lanes.wc.exec]
command = [{sim}]
[lanes.wc.env]
LANED_SIM_STARTUP = "{cached}"
[lanes.wc.rank.1]
args = [{{ flag = "--headless" }}]

[lanes.solo]
port = {8101 if sleeps else 8100}
served_model_name = "solo"
{fast}[lanes.solo.exec]
command = [{sim}]
[lanes.solo.env]
LANED_SIM_STARTUP = "0.3"
{on_gpus}"""
    path = home / "laned.toml"
    path.write_text(text)
    return path


def start_laned(host: Host, path: Path, log: Path) -> None:
    gpus = path.parent / "gpus"  # laned reads this host's simulated GPU where its lanes hold it
    if "sleep_level = 1" in path.read_text():
        host.env["LANED_SIM_GPUS"] = str(gpus)
    with log.open("ab") as out:
        host.laned = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{host.ns}", sys.executable, "-m", "laned", "--config", str(path), "serve"],
            env=host.env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
    wait_until(lambda: _answers(host), 60, f"{host.name}'s laned")


def _answers(host: Host) -> bool:
    assert host.laned is not None and host.laned.poll() is None, "laned exited"
    try:
        return bool(host.api("GET", "/healthz")["status"] == 200)
    except (subprocess.CalledProcessError, json.JSONDecodeError):
        return False


def state(host: Host, lane: str = "w") -> str:
    return str(host.lane(lane)["state"])


def run_on_both(
    hosts: tuple[Host, Host], tmp_path: Path, master: int, steps: Callable[[], None], **kw: Any
) -> None:
    """Both hosts' laned on the shared config (`kw`: config's), then `steps`; on a failure,
    each host's laned log and journal are printed."""
    for host in hosts:
        start_laned(host, config(tmp_path, host, master, **kw), tmp_path / f"{host.name}.log")
    try:
        steps()
    except BaseException:
        for host in hosts:
            print(
                f"===== {host.name} laned =====\n{(tmp_path / f'{host.name}.log').read_text()[-6000:]}"
            )
            print(host.run("journalctl", "--user", "-n", "60", "--no-pager", check=False).stdout)
        raise


def test_a_lane_over_two_hosts_runs_fails_and_recovers_as_one(
    two_hosts: tuple[Host, Host], tmp_path: Path
) -> None:
    a, b = two_hosts
    master = 29655

    def steps() -> None:
        scenario(a, b, master)
        cached_scenario(a, b, master)

    run_on_both(two_hosts, tmp_path, master, steps)


def test_a_lane_over_two_hosts_sleeps_and_wakes_as_one_each_host_confirming_its_own(
    two_hosts: tuple[Host, Host], tmp_path: Path
) -> None:
    run_on_both(two_hosts, tmp_path, 29656, lambda: sleep_scenario(*two_hosts), sleeps=True)


def events(host: Host, lane: str = "w") -> list[str]:
    body = host.api("GET", f"/events?lane={lane}&limit=500")["body"]
    return [str(e.get("reason", "")) for e in body["events"]]


def sleep_scenario(a: Host, b: Host) -> None:
    assert a.api("POST", "/lanes/w/activate")["status"] == 202
    wait_until(lambda: state(a) == "ready" and state(b) == "ready", 60, "both ranks ready")
    # A one-host lane on the head: the head's engine sleeps every rank; each host confirms
    # its own rank's GPU memory fell, and the worker's rank is a sleeper of its host.
    assert a.api("POST", "/lanes/solo/activate")["status"] == 202
    wait_until(lambda: state(a, "solo") == "ready", 30, "the one-host lane on the head")
    wait_until(lambda: state(a) == "sleeping" and state(b) == "sleeping", 20, "both ranks asleep")
    assert b.lane("w")["desired"] == "inactive"
    said = events(b)
    assert any("GiB of GPU memory released" in m and "with its head" in m for m in said), said
    assert any("rank 1 on host-b asleep (level 1), confirmed there" in m for m in events(a))
    # The worker's host runs its own one-host lane beside the sleeping rank.
    assert b.api("POST", "/lanes/solo/activate")["status"] == 202
    wait_until(lambda: state(b, "solo") == "ready", 30, "the one-host lane on the worker")
    assert state(b) == "sleeping"
    # The lane again: each host stops its one-host lane and clears its GPU; the head wakes
    # every rank (no cold start: no restart, the same engines).
    assert a.api("POST", "/lanes/w/activate")["status"] == 202
    wait_until(lambda: state(a) == "ready" and state(b) == "ready", 60, "both ranks awake")
    assert state(a, "solo") == "inactive" and state(b, "solo") == "inactive"
    for host in (a, b):
        assert host.lane("w")["restarts"] == 0
        assert any("waking (level 1)" in m for m in events(host)), events(host)


def scenario(a: Host, b: Host, master: int) -> None:
    # Activated on the worker's host: the head coordinates, both ranks start.
    asked = b.api("POST", "/lanes/w/activate")
    assert asked["status"] == 202, asked
    wait_until(lambda: state(a) == "ready" and state(b) == "ready", 60, "both ranks ready")
    head = a.lane("w")
    assert head["rank"]["rank"] == 0 and b.lane("w")["rank"]["headless"] is True
    wait_until(
        lambda: (a.lane("w")["rank"]["peers"][0] or {}).get("state") == "ready",
        10,
        "the head's view of its worker",
    )
    # Each host shows the lane with its rank; the head, its worker; /sd, the head's engine.
    metrics = a.api("GET", "/metrics")["body"]
    assert 'laned_lane_rank{lane="w"} 0.0' in metrics
    assert 'laned_peer_up{host="host-b",lane="w",rank="1"} 1.0' in metrics
    assert 'laned_lane_rank{lane="w"} 1.0' in b.api("GET", "/metrics")["body"]
    assert [t["labels"]["lane"] for t in a.api("GET", "/sd")["body"]] == ["w"]
    assert b.api("GET", "/sd")["body"] == []
    # A rank_only call without the peer token is refused.
    assert b.api("POST", "/lanes/w/deactivate?rank_only=true")["status"] == 403

    # The worker's engine dies with status 0: the head's engine dies with it; both come back.
    killed = subprocess.run(
        ["pkill", "-USR1", "-f", f"node-rank 1 --master-addr 10.77.0.1 --master-port {master}"],
        capture_output=True, timeout=10,
    )  # fmt: skip
    assert killed.returncode == 0, "no worker engine to kill"
    wait_until(
        lambda: a.lane("w")["restarts"] >= 1 and b.lane("w")["restarts"] >= 1,
        30,
        "both ranks restarted",
    )
    wait_until(lambda: state(a) == "ready" and state(b) == "ready", 60, "both ranks ready again")
    assert (
        b.lane("w")["last_exit"]["code"] == 0 and b.lane("w")["last_exit"]["verdict"] == "failure"
    )
    restarts = a.lane("w")["restarts"]

    # The link is cut: the head cannot reach the worker's laned; degraded, nothing restarted.
    tag = a.ns.split("-")[1]
    a.run("ip", "link", "set", f"v{tag}a", "down")
    wait_until(lambda: state(a) == "degraded", 20, "the head degraded")
    assert "peer host-b (rank 1) unreachable" in a.lane("w")["reason"]
    # No restart storm: over 15 s (three of the head's looks at its worker, each 2 s apart
    # and up to 3 s to find it unreachable), neither a restart nor a change of state may come.
    with pytest.raises(AssertionError, match="timed out after 15s"):
        wait_until(
            lambda: a.lane("w")["restarts"] != restarts or state(a) != "degraded",
            15,
            "a restart or a change of state, which must not come",
            interval=1,
        )
    a.run("ip", "link", "set", f"v{tag}a", "up")
    wait_until(lambda: state(a) == "ready", 30, "the head ready again")

    # A one-host lane on the head swaps the lane away there; the worker's rank follows.
    assert a.api("POST", "/lanes/solo/activate")["status"] == 202
    wait_until(lambda: state(a, "solo") == "ready", 30, "the one-host lane")
    wait_until(
        lambda: b.lane("w")["desired"] == "inactive" and state(b) == "inactive",
        20,
        "the worker stopped",
    )
    assert a.lane("w")["desired"] == "inactive"


def ready_after(hosts: tuple[Host, ...], lane: str, since: float) -> float:
    """Seconds from `since` until the last of the hosts' ranks of `lane` was ready again, by
    each laned's own event (one clock: the hosts share a machine)."""
    last = since
    for host in hosts:
        events = host.api("GET", f"/events?lane={lane}&limit=500")["body"]["events"]
        last = max(last, min(e["at"] for e in events if e["to"] == "ready" and e["at"] >= since))
    return last - since


def reasons(host: Host, lane: str, since: float) -> list[str]:
    events = host.api("GET", f"/events?lane={lane}&limit=500")["body"]["events"]
    return [str(e["reason"]) for e in events if e["at"] >= since]


def kill_worker_engine(lane_master: int) -> None:
    """The worker's engine dies with status 0 (SIGUSR1; its daemon's command carries the
    same flags, hence `sim serve`)."""
    killed = subprocess.run(
        ["pkill", "-USR1", "-f", f"sim serve .*node-rank 1 --master-addr 10.77.0.1 --master-port {lane_master}"],
        capture_output=True, timeout=10,
    )  # fmt: skip
    assert killed.returncode == 0, "no worker engine to kill"


def both(hosts: tuple[Host, Host], lane: str, check: Any) -> bool:
    return all(check(host.lane(lane)) for host in hosts)


def cached_scenario(a: Host, b: Host, master: int) -> dict[str, float]:
    """`wc`, whose weights each host keeps in its own weight-cache daemon: activated (cold);
    the worker's engine dies (both ranks ready again from their own host's daemon); the
    worker's daemon dies (that failure counted once on each host; both hosts' daemons start
    again, as vLLM's group forms once). The seconds each took, for bench/two_hosts.py (the
    test asserts no timing)."""
    hosts, took = (a, b), {}
    since = time.time()
    assert a.api("POST", "/lanes/wc/activate")["status"] == 202
    wait_until(lambda: state(a, "wc") == "ready" and state(b, "wc") == "ready", 60, "wc ready")
    took["cold_activation"] = ready_after(hosts, "wc", since)
    assert both(hosts, "wc", lambda v: v["weight_cache"]["state"] == "ready")
    assert both(hosts, "wc", lambda v: v["start_kind"] == "cold")
    restarts = [h.lane("wc")["restarts"] for h in hosts]

    # An engine's death: each rank maps its shards from its own host's daemon.
    since = time.time()
    kill_worker_engine(master + 10)
    wait_until(
        lambda: all(
            v["restarts"] > n and v["state"] == "ready" and v["start_kind"] == "weight-cache"
            for v, n in zip((h.lane("wc") for h in hosts), restarts, strict=True)
        ),
        60,
        "both ranks ready again from the weight cache",
    )
    took["engine_death_from_cache"] = ready_after(hosts, "wc", since)
    assert both(hosts, "wc", lambda v: "weight-cache" in v["last_starts"])
    restarts = [h.lane("wc")["restarts"] for h in hosts]

    # The worker's daemon dies: its host fails the lane (once) and starts both again; the
    # head's engine dies with the worker's, and the head's daemon starts again before it
    # maps (the group it formed with is gone).
    since = time.time()
    b.run("systemctl", "--user", "kill", "--signal=SIGKILL", b.lane("wc")["weight_cache"]["unit"])
    wait_until(
        lambda: all(
            v["restarts"] > n and v["state"] == "ready" and v["weight_cache"]["state"] == "ready"
            for v, n in zip((h.lane("wc") for h in hosts), restarts, strict=True)
        ),
        60,
        "both ranks and both daemons ready again",
    )
    took["daemon_death_cold"] = ready_after(hosts, "wc", since)
    assert [h.lane("wc")["restarts"] for h in hosts] == [n + 1 for n in restarts]  # once each
    assert both(hosts, "wc", lambda v: v["start_kind"] == "cold")
    assert any("weight-cache daemon exited" in r for r in reasons(b, "wc", since))
    said = reasons(a, "wc", since)
    assert any("weight-cache daemon of rank 1 on host-b" in r for r in said), said
    return took
