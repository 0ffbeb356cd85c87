"""The shape of the package, checked over its import graph (ast, no import runs):
no import loops, a pure core that reaches no adapter, and modules of a readable size."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "laned"

# The pure core: config model, rendering, decisions. No I/O library, no adapter.
CORE = {
    "laned.policy",
    "laned.resume",
    "laned.lanes",
    "laned.liveness",
    "laned.phases",
    "laned.unit_state",
    "laned.model",
    "laned.config",
    "laned.checks",
    "laned.units",
    "laned.wrapper",
    "laned.names",
    "laned.errors",
    "laned.durations",
    "laned.cmdline",
    "laned.importer",
    "laned.run_options",
    "laned.import_toml",
    "laned.toml_text",
    "laned.ranks",
    "laned.secrecy",
    "laned.engine_checks",
    "laned.engine_flags",
}
# The edges: they talk to systemd, podman, NVML, journald, engines, files, processes.
ADAPTERS = {
    "laned.systemd",
    "laned.podman",
    "laned.gpus",
    "laned.host",
    "laned.probes",
    "laned.journal",
    "laned.engine_api",
    "laned.state",
    "laned.proc",
    "laned.bus",
    "laned.steps",
    "laned.watchers",
    "laned.peers",
    "laned.engine_parser",
}
IO_LIBRARIES = {"asyncio", "httpx", "dbus_fast", "podman", "pynvml", "subprocess", "socket"}
MAX_LINES = 430  # "a few hundred" each; the simulator's engine is held to it too


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """(laned modules, top-level outside packages) that `path` imports at run time."""
    tree = ast.parse(path.read_text())
    internal: set[str] = set()
    external: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue  # annotations only
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                add(child.module)
                for alias in child.names:
                    add(f"{child.module}.{alias.name}")
            visit(child)

    def add(name: str) -> None:
        if name.split(".")[0] != "laned":
            external.add(name.split(".")[0])
        elif name in known:
            internal.add(name)

    visit(tree)
    return internal, external


def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    found = modules()
    edges, outside = {}, {}
    for name, path in found.items():
        edges[name], outside[name] = imports(path, set(found))
        edges[name].discard(name)
        edges[name].discard("laned")  # `from laned import x` names the module x itself
    return edges, outside


def closure(start: str, edges: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in edges[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_import_graph_has_no_loops() -> None:
    edges, _ = graph()
    loops = sorted(m for m in edges if m in closure(m, edges))
    assert loops == [], f"modules that import themselves through others: {loops}"


def test_the_core_reaches_no_adapter_and_no_io_library() -> None:
    edges, outside = graph()
    for module in sorted(CORE):
        reached = closure(module, edges) | {module}
        assert not reached & ADAPTERS, f"{module} reaches adapters {sorted(reached & ADAPTERS)}"
        libraries = set().union(*(outside[m] for m in reached))
        assert not libraries & IO_LIBRARIES, f"{module} reaches {sorted(libraries & IO_LIBRARIES)}"


def test_policy_imports_no_asyncio_httpx_dbus_or_podman() -> None:
    _, outside = graph()
    assert not outside["laned.policy"] & {"asyncio", "httpx", "dbus_fast", "podman"}


def test_modules_stay_small() -> None:
    big = {
        name: n
        for name, path in modules().items()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert big == {}, f"modules over {MAX_LINES} lines (split them by concern): {big}"
