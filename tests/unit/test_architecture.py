"""The shape of the package, checked over its import graph (ast, no import runs), by folder:
every module is held to the rules of the folder it sits in.

- pure folders (config, core, engines, render, preflight, importer) import only pure folders, and
  reach no I/O library, no file and no environment (config/load.py reads the config file);
- adapters import pure folders and adapters, never the owner or an edge;
- gates (run against engines) import pure folders, adapters and gates;
- the owner imports pure folders, adapters, gates and itself, never an edge (api, cli,
  daemon); of the owner only its wiring (owner/wiring.py) imports an adapter, and no part
  of the owner imports the wiring: the parts reach the host through the seam's protocols
  (owner/seam.py), each of a dozen members at most, each member with a one-line docstring;
- the simulator (its own program, an HTTP server) imports only pure folders;
- no import loop, TYPE_CHECKING imports included;
- the API reaches the host only through the supervisor; the CLI reads no state file and asks
  systemd nothing the daemon answers;
- a lane's record is changed by the lane machine's runner alone;
- every exception laned raises sits in errors.py's tree (a class of its own elsewhere only
  when private to its module), and none raises the bare root `LanedError`.

Modules are sized by their one job, not by a line cap.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "laned"

PURE = {"config", "core", "engines", "render", "preflight", "importer"}
ALLOWED: dict[str, set[str]] = {
    **{folder: PURE for folder in PURE},
    "adapters": PURE | {"adapters"},
    "gates": PURE | {"adapters", "gates"},
    "owner": PURE | {"adapters", "gates", "owner"},
    "sim": PURE | {"sim"},
}
EDGES = {"api", "cli", "daemon"}  # may import any folder: they are where it is all put together
TOP = {"errors"}  # imported by everyone; imports nothing of laned
IO_LIBRARIES = {
    "asyncio", "httpx", "dbus_fast", "podman", "pynvml", "subprocess", "socket",
    "prometheus_client", "fastapi", "uvicorn", "os", "tempfile", "shutil",
}  # fmt: skip
# Reading the config file is config/load.py's one job: the environment and the host name are
# read there and passed in (the model takes them from its validation context).
READS_THE_CONFIG = "laned.config.load"
PATH_IO = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "unlink", "mkdir",
           "exists", "is_file", "is_dir", "stat", "iterdir", "glob", "rglob", "touch"}  # fmt: skip
# What the API's modules may take from adapters: the proxy's transport to the engines (the hot
# path) and its reader of large bodies (a worker process, off the event loop), and the API's
# own token file read as laned starts or reloads (its settings).
API_ADAPTERS = {
    "laned.adapters.upstream", "laned.adapters.body_parser", "laned.adapters.secret_files",
}  # fmt: skip


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def folder(module: str) -> str:
    """`laned.core.policy` -> core; `laned.errors` -> errors; `laned` -> laned."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imports(path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """(laned modules, top-level outside packages) that `path` imports, TYPE_CHECKING too."""
    internal: set[str] = set()
    external: set[str] = set()

    def add(name: str) -> None:
        if name.split(".")[0] != "laned":
            external.add(name.split(".")[0])
        elif name in known:
            internal.add(name)

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            add(node.module)
            for alias in node.names:
                add(f"{node.module}.{alias.name}")
    return internal, external


def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    found = modules()
    edges, outside = {}, {}
    for name, path in found.items():
        edges[name], outside[name] = imports(path, set(found))
        edges[name] -= {name, "laned"}  # `from laned.core import x` names the module x itself
        edges[name] = {m for m in edges[name] if m.count(".") > 1 or folder(m) in TOP | EDGES}
    return edges, outside


def closure(start: str, edges: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in edges[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_every_module_sits_in_a_folder_with_rules() -> None:
    loose = {m for m in modules() if folder(m) not in {*ALLOWED, *EDGES, *TOP, "laned", "__main__"}}
    assert loose == set(), f"modules in no known folder (add the folder's rules here): {loose}"


def test_each_folder_imports_only_what_its_layer_may() -> None:
    edges, _ = graph()
    wrong = {
        module: sorted(m for m in targets if folder(m) not in ALLOWED[folder(module)] | TOP)
        for module, targets in edges.items()
        if folder(module) in ALLOWED
    }
    wrong = {module: bad for module, bad in wrong.items() if bad}
    assert wrong == {}, f"imports across layers: {wrong}"


WIRING = "laned.owner.wiring"  # builds the seam's protocols over the adapters
SEAM = PACKAGE / "owner" / "seam.py"
PROTOCOL_MEMBERS = 12


def test_only_the_wiring_of_the_owner_imports_an_adapter() -> None:
    """The owner's parts act on the host through the seam (laned.owner.seam): no module of the
    owner but its wiring imports laned.adapters (TYPE_CHECKING imports included), and none
    imports the wiring (laned serve, the tests and the benches build the seam with it)."""
    edges, _ = graph()
    found = sorted(
        f"{module} imports {target}"
        for module, targets in edges.items()
        if folder(module) == "owner" and module != WIRING
        for target in targets
        if folder(target) == "adapters" or target == WIRING
    )
    assert found == [], "\n".join(found)


def test_the_seams_protocols_are_small_and_each_member_says_what_it_does() -> None:
    """Every Protocol of owner/seam.py: at most PROTOCOL_MEMBERS members (methods and
    properties), each with a one-line docstring."""
    tree = ast.parse(SEAM.read_text())
    protocols = [
        node
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        and any(ast.unparse(base) in {"Protocol", "typing.Protocol"} for base in node.bases)
    ]
    assert protocols, "owner/seam.py defines no protocol"
    found = []
    for protocol in protocols:
        members = [
            node
            for node in protocol.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and not node.name.startswith("_")
        ]
        if len(members) > PROTOCOL_MEMBERS:
            found.append(f"{protocol.name}: {len(members)} members (at most {PROTOCOL_MEMBERS})")
        for member in members:
            doc = ast.get_docstring(member)
            if not doc or "\n" in doc:
                found.append(f"{protocol.name}.{member.name}: no one-line docstring")
    assert found == [], "\n".join(found)


def test_errors_imports_nothing_of_laned() -> None:
    edges, _ = graph()
    assert edges["laned.errors"] == set()


def test_the_pure_folders_reach_no_io_library() -> None:
    """No process, socket, file or environment access in config/, core/, render/, preflight/,
    importer/ (config/load.py aside), through any module they import."""
    edges, outside = graph()
    for module in sorted(m for m in edges if folder(m) in PURE and m != READS_THE_CONFIG):
        reached = (closure(module, edges) | {module}) - {READS_THE_CONFIG}
        libraries = set().union(*(outside[m] for m in reached))
        assert not libraries & IO_LIBRARIES, f"{module} reaches {sorted(libraries & IO_LIBRARIES)}"


def test_the_pure_folders_open_no_file() -> None:
    """No `open()` and no pathlib reading or writing in the pure folders (config/load.py reads
    the config file): rendering returns contents, laned.adapters.rendered writes them."""
    found = []
    for name, path in modules().items():
        if folder(name) not in PURE or name == READS_THE_CONFIG:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            called = node.func
            if (isinstance(called, ast.Name) and called.id == "open") or (
                isinstance(called, ast.Attribute) and called.attr in PATH_IO
            ):
                found.append(f"{name}:{node.lineno}: {ast.unparse(called)}")
    assert found == [], "file I/O in a pure folder:\n" + "\n".join(found)


def test_the_front_and_the_api_reach_the_host_through_the_owner() -> None:
    """api/ reads the host through the supervisor's read methods (its seam), never an adapter
    of its own (API_ADAPTERS aside) nor the supervisor's seam or records."""
    edges, _ = graph()
    found = [
        f"{module} imports {target}"
        for module, targets in edges.items()
        if folder(module) == "api"
        for target in targets
        if folder(target) == "adapters" and target not in API_ADAPTERS
    ]
    for name, path in modules().items():
        if folder(name) == "api":
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and node.attr in {"seam", "records"}:
                    found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert found == [], "\n".join(found)


def test_the_cli_asks_the_daemon_not_its_state_file_nor_systemd() -> None:
    """cli/ reads no state file; it talks to systemd only to install laned (cli/install.py)
    and to learn the manager's version for rendering (`installed_version`)."""
    found = []
    for name, path in modules().items():
        if folder(name) != "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = {alias.name for alias in node.names}
                if node.module == "laned.adapters.state" or (
                    node.module == "laned.adapters" and "state" in names
                ):
                    found.append(f"{name}:{node.lineno}: the state file")
                systemd = node.module == "laned.adapters.systemd" and name != "laned.cli.install"
                if systemd and names - {"installed_version"}:
                    found.append(f"{name}:{node.lineno}: systemd ({sorted(names)})")
    assert found == [], "\n".join(found)


def test_the_import_graph_has_no_loops_type_checking_included() -> None:
    edges, _ = graph()
    loops = sorted(m for m in edges if m in closure(m, edges))
    assert loops == [], f"modules that import themselves through others: {loops}"


def test_every_exception_is_in_the_error_tree_and_none_raises_the_bare_root() -> None:
    outside, bare = [], []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and name != "laned.errors":
                bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
                if bases & EXCEPTION_BASES and not node.name.startswith("_"):
                    outside.append(f"{name}.{node.name}")
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                called = node.exc.func
                if isinstance(called, ast.Name) and called.id == "LanedError":
                    bare.append(f"{name}:{node.lineno}")
    assert outside == [], f"exceptions outside laned/errors.py: {outside}"
    assert bare == [], f"a bare LanedError raised (raise a class of the tree): {bare}"


EXCEPTION_BASES = {
    "Exception", "BaseException", "ValueError", "RuntimeError", "OSError", "ConnectionError",
    "TypeError", "KeyError", "LookupError", "LanedError",
}  # fmt: skip


def test_the_public_surface_listed_in_laned_resolves() -> None:
    import laned

    assert {name: getattr(laned, name) is not None for name in laned.__all__} == dict.fromkeys(
        laned.__all__, True
    )


def test_every_laned_error_is_in_the_drawn_tree_of_errors_py() -> None:
    tree = ast.parse((PACKAGE / "errors.py").read_text())
    drawn = ast.get_docstring(tree) or ""
    ours = {
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef) and node.name not in {"Severity", "Finding"}
    }
    assert {name for name in ours if f" {name} " not in drawn} == set(), "classes not drawn"
    elsewhere = {
        f"{name}.{node.name}"
        for name, path in modules().items()
        if name != "laned.errors"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and any(isinstance(b, ast.Name) and b.id in ours for b in node.bases)
    }
    assert elsewhere == set(), f"LanedErrors defined outside errors.py: {elsewhere}"


RECORD_OWNERS = {"laned.core.lanes", "laned.owner.ledger"}  # the record, and its runner
MUTATORS = {"append", "extend", "clear", "pop", "popleft", "remove", "update", "add", "insert"}


def record_fields() -> set[str]:
    tree = ast.parse((PACKAGE / "core" / "lanes.py").read_text())
    record = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "LaneStatus")
    return {
        s.target.id
        for s in record.body
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
    }


def test_a_lanes_record_is_changed_by_the_machines_runner_alone() -> None:
    """Outside laned.owner.ledger (and the record's own module), nothing assigns to a lane's
    record or changes one of its collections in place: a state moves through Ledger.fire, what
    a run showed through the ledger's methods. A record is what the code names `status` or
    reaches through `statuses`."""
    fields, found = record_fields(), []
    for name, path in modules().items():
        if name in RECORD_OWNERS or folder(name) == "sim":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[ast.expr] = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                targets = [t.value if isinstance(t, ast.Subscript) else t for t in targets]
                targets = [
                    e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])
                ]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in MUTATORS
            ):
                targets = [node.func.value]
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr in fields
                    and "status" in ast.unparse(target.value)
                ):
                    found.append(f"{name}:{node.lineno}: {ast.unparse(target)}")
    assert found == [], "a lane's record changed outside its runner:\n" + "\n".join(found)
