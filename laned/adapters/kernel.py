"""What the kernel says of this host: memory (/proc/meminfo), a filesystem's size, whether a
port is taken, and the processes of a cgroup (v2). Blocking: callers run them off the loop.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket

from laned.core.facts import GIB


def meminfo() -> dict[str, float]:
    """/proc/meminfo in GiB (MemTotal, MemAvailable, ...); {} where it cannot be read."""
    out: dict[str, float] = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    out[key] = int(parts[0]) / 1024**2
    except OSError:
        return {}
    return out


def disk_total_gib(path: str) -> float | None:
    """Size of the filesystem holding `path` (or its nearest existing parent), in GiB."""
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    try:
        st = os.statvfs(path or "/")
    except OSError:
        return None
    return st.f_blocks * st.f_frsize / GIB


def port_busy(port: int, host: str = "0.0.0.0") -> bool:
    """Whether something listens on the port: bind without SO_REUSEPORT fails then."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR so that connections in TIME_WAIT do not count; a listener still does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def cgroup_of(pid: int) -> str:
    """The cgroup (v2) a process is in, as a path under /sys/fs/cgroup ("" if unknown)."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return ""


def cgroup2_root(mounts: str = "/proc/self/mounts") -> str:
    """Where the unified (v2) cgroup hierarchy is mounted: /sys/fs/cgroup on a pure-v2 host,
    /sys/fs/cgroup/unified on a hybrid one."""
    try:
        with open(mounts, encoding="utf-8") as handle:
            for line in handle:
                fields = line.split()
                if len(fields) > 2 and fields[2] == "cgroup2":
                    return fields[1]
    except OSError:
        pass
    return "/sys/fs/cgroup"


def cgroup_pids(path: str, root: str | None = None) -> set[int]:
    """The processes in a cgroup and every cgroup below it (empty for "" or one that is gone)."""
    if not path:
        return set()
    root = cgroup2_root() if root is None else root
    pids: set[int] = set()
    for where, _dirs, files in os.walk(root + path):
        if "cgroup.procs" in files:
            try:
                with open(os.path.join(where, "cgroup.procs"), encoding="utf-8") as handle:
                    pids.update(int(line) for line in handle if line.strip())
            except (OSError, ValueError):
                continue
    return pids


def memory_limit(pid: int | None = None, root: str | None = None) -> int | None:
    """The lowest `memory.max` (cgroup v2) of a process's cgroup and the cgroups above it, in
    bytes (this process's by default); None where none is set or it cannot be read."""
    path = cgroup_of(os.getpid() if pid is None else pid)
    if not path:
        return None
    root = cgroup2_root() if root is None else root
    lowest: int | None = None
    while True:
        try:
            with open(os.path.join(root + path, "memory.max"), encoding="ascii") as handle:
                text = handle.read().strip()
        except OSError:
            text = "max"
        if text.isdigit():
            lowest = int(text) if lowest is None else min(lowest, int(text))
        if path in ("", "/"):
            return lowest
        path = os.path.dirname(path)


def cgroup_memory(pid: int | None = None, root: str | None = None) -> list[tuple[int, int]]:
    """(memory.max, memory.current) in bytes of a process's cgroup (v2) and each cgroup above
    it that has a limit (this process's by default); [] where none has one or it cannot be
    read. What bounds the unified memory pool beside MemAvailable (laned.core.unified)."""
    path = cgroup_of(os.getpid() if pid is None else pid)
    if not path:
        return []
    root = cgroup2_root() if root is None else root
    out = []
    while True:
        where = root + path
        try:
            with open(os.path.join(where, "memory.max"), encoding="ascii") as handle:
                limit = handle.read().strip()
            with open(os.path.join(where, "memory.current"), encoding="ascii") as handle:
                current = handle.read().strip()
        except OSError:
            limit = current = ""
        if limit.isdigit() and current.isdigit():
            out.append((int(limit), int(current)))
        if path in ("", "/"):
            return out
        path = os.path.dirname(path)


def usable_memory() -> int | None:
    """The bytes of memory this process may use: the host's (MemTotal), or its cgroup's limit
    where that is lower; None where neither can be read."""
    total = meminfo().get("MemTotal")
    limit = memory_limit()
    candidates = [int(total * GIB)] if total else []
    candidates += [limit] if limit is not None else []
    return min(candidates) if candidates else None


# glibc's mallopt parameter for the size from which an allocation is its own mapping.
M_MMAP_THRESHOLD = -3


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def trim_memory() -> None:
    """Give the memory glibc keeps free in its heap back to the kernel (malloc_trim(3)): what
    a burst of request bodies left behind, once they are answered. Nothing where the C
    library is not glibc."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim(0)


def give_back_large_buffers(threshold: int = 1024 * 1024) -> bool:
    """Have glibc map every allocation of `threshold` bytes or more on its own, so that it
    goes back to the kernel when freed. glibc raises that threshold after the first large
    free (up to 32 MiB), and request bodies then come from its heap, which keeps what they
    leave: laned held 830 MiB after a burst of bodies it had long answered. A fixed
    threshold also turns off that raise (mallopt(3)). False where the C library is not
    glibc (nothing changed)."""
    mallopt = getattr(_libc(), "mallopt", None)
    return mallopt is not None and bool(mallopt(M_MMAP_THRESHOLD, threshold))
