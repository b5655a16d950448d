"""The pure core never reads a clock, does I/O, spawns threads or reaches into the
node/network layers: every replica must compute the same answers from the log."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

PKG = Path(__file__).resolve().parents[2] / "raftsched"

#: The layers, one folder each. ``core`` is pure; ``wire`` may use only the core;
#: ``node`` may use core and wire; nothing but the public face imports ``faces``.
LAYERS = ("core", "node", "wire", "faces")
CORE = tuple(sorted(p.stem for p in (PKG / "core").glob("*.py") if p.stem != "__init__"))
ALLOWED_LAYERS = {"core": {"core"}, "wire": {"core", "wire"}, "node": {"core", "wire", "node"},
                  "faces": set(LAYERS)}

#: Never imported by any core module (``gc``: its switches are process-wide).
BANNED_MODULES = {"gc", "time", "threading", "socket", "asyncio", "os", "random", "uuid",
                  "pysyncobj", "subprocess", "multiprocessing", "selectors", "signal",
                  "secrets", "logging", "concurrent", "io", "pathlib", "shutil", "tempfile",
                  "urllib", "http", "ssl"}
#: Modules only some core modules may import.
RESTRICTED = {
    "zoneinfo": {"cron"},
    "importlib": {"cron"},  # importlib.resources: zone files from the tzdata package
    "croniter": {"cron"},
    "hashlib": {"trigger"},
    "calendar": {"cron"},
    "datetime": {"cron", "durations"},
    "struct": {"codec"},
    "msgpack": {"codec", "packing"},
}
#: Calls that read a clock or entropy, whatever they are imported as.
CLOCK_ATTRS = {"now", "utcnow", "today", "time", "time_ns", "monotonic", "monotonic_ns",
               "perf_counter", "perf_counter_ns", "process_time", "getrandbits", "urandom",
               "uuid1", "uuid4"}
CLOCK_TEXT = re.compile(r"datetime\.now|datetime\.utcnow|date\.today|time\.time|"
                        r"time\.monotonic|time\.perf_counter|\.now\(|(?<![\w.])time\(")


def _source(name: str) -> str:
    """A core module's source (``name``), or any package file's (a path)."""
    path = Path(name) if name.endswith(".py") else PKG / "core" / f"{name}.py"
    return path.read_text(encoding="utf-8")


def _code_text(name: str) -> str:
    """The source without docstrings and comments (prose may mention clocks)."""
    tree = ast.parse(_source(name))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                body[0] = ast.Pass()
    return ast.unparse(tree)


def _imports(name: str) -> list[str]:
    """Every module an import statement in the file names (also inside functions and
    TYPE_CHECKING blocks), absolute, dotted."""
    out: list[str] = []
    for node in ast.walk(ast.parse(_source(name))):
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = "raftsched.core" if node.level == 1 else ""
                mod = f"{base}.{node.module}" if node.module else base
                out.extend([mod] + [f"{mod}.{a.name}" for a in node.names])
            else:
                mod = node.module or ""
                out.append(mod)
                if mod == "raftsched":
                    out.extend(f"raftsched.{a.name}" for a in node.names)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id == "__import__":
            out.append("__import__")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "import_module":
            out.append("importlib.import_module")
    return out


def test_core_modules_exist() -> None:
    for name in ("model", "trigger", "misses", "state", "claims", "records", "codec", "leader"):
        assert name in CORE, name


def _layer_of(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "raftsched" and parts[1] in LAYERS \
        else None


@pytest.mark.parametrize("path", sorted(str(p) for p in PKG.rglob("*.py")),
                         ids=lambda p: str(Path(p).relative_to(PKG)))
def test_layers_import_only_downwards(path: str) -> None:
    """Every module sits in a layer folder and imports only the layers below it;
    only the public face (``raftsched/__init__.py``, ``__main__``) imports a face."""
    rel = Path(path).relative_to(PKG)
    if len(rel.parts) == 1:
        assert rel.name in ("__init__.py", "__main__.py"), f"{rel} is outside the layers"
        return
    layer = rel.parts[0]
    assert layer in LAYERS, f"{rel}: unknown layer folder"
    for mod in _imports(path):
        if mod == "raftsched":
            continue  # the package itself (its lazy public names)
        target = _layer_of(mod)
        if mod.startswith("raftsched") and target is None:
            raise AssertionError(f"{rel} imports {mod}, which is in no layer")
        if target is not None:
            assert target in ALLOWED_LAYERS[layer], f"{rel} ({layer}) imports {mod}"


@pytest.mark.parametrize("name", CORE)
def test_no_banned_imports(name: str) -> None:
    for mod in _imports(name):
        top = mod.split(".")[0]
        assert top not in BANNED_MODULES, f"{name} imports {mod}"
        assert mod not in ("__import__", "importlib.import_module"), f"{name}: dynamic import"
        if top == "raftsched":
            assert mod.startswith("raftsched.core"), f"{name} imports {mod}, outside the core"
        if top in RESTRICTED:
            assert name in RESTRICTED[top], f"{name} imports {mod}"


@pytest.mark.parametrize("name", CORE)
def test_no_clock_or_entropy_calls(name: str) -> None:
    tree = ast.parse(_source(name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute):
                assert func.attr not in CLOCK_ATTRS, (
                    f"{name}:{node.lineno} calls .{func.attr}()")
            elif isinstance(func, ast.Name):
                assert func.id not in CLOCK_ATTRS, f"{name}:{node.lineno} calls {func.id}()"
    found = CLOCK_TEXT.findall(_code_text(name))
    assert not found, f"{name} mentions {found}"


@pytest.mark.parametrize("name", CORE)
def test_no_builtin_hash_or_io(name: str) -> None:
    """hash() is salted per process and open()/print() are I/O: replicas would differ."""
    for node in ast.walk(ast.parse(_source(name))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in {"hash", "open", "print", "input", "id"}, (
                f"{name}:{node.lineno} calls {node.func.id}()")


def test_checker_catches_violations(tmp_path: Path) -> None:
    """The scanner itself works (a broken checker would pass everything)."""
    probe = tmp_path / "probe.py"
    probe.write_text("import time\nfrom raftsched.node import events\n"
                     "def f():\n    from raftsched.faces.cli import main\n"
                     "from . import trigger\n")
    found = _imports(str(probe))
    assert {"time", "raftsched.node", "raftsched.faces.cli", "raftsched.core.trigger"} <= set(found)
    assert _layer_of("raftsched.faces.cli") == "faces" and _layer_of("time") is None
    assert "faces" not in ALLOWED_LAYERS["node"] and ALLOWED_LAYERS["core"] == {"core"}
    bad = "import time\nfrom datetime import datetime\nx = datetime.now()\ny = time.time()\n"
    tree = ast.parse(bad)
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert "time" in names
    calls = [n.func.attr for n in ast.walk(tree)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    assert set(calls) <= CLOCK_ATTRS and calls
    assert CLOCK_TEXT.findall(bad) == ["datetime.now", "time.time"]
    assert CLOCK_TEXT.findall("clock.now()\nt = time()") == [".now(", "time("]
    assert not CLOCK_TEXT.findall("datetime(2026, 1, 1)\nfire_times(s)\nx.timeout(3)")


# ------------------------------------------------------------------ no cycles

def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _import_graph(root: Path = PKG) -> dict[str, set[str]]:
    """Module -> the package modules it imports (anywhere in it: inside functions and
    ``TYPE_CHECKING`` blocks too), each import resolved to the longest module it names.
    A package's ``__init__`` is left out as a target: importing ``raftsched.core`` for
    a submodule is how Python reaches it, not a dependency on the package's body."""
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            named: list[str] = []
            if isinstance(node, ast.Import):
                named = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                named = [base] + [f"{base}.{a.name}" for a in node.names]
            for mod in named:
                while mod and mod not in files:
                    mod = mod.rpartition(".")[0]
                if mod and mod != name and files[mod].name != "__init__.py":
                    targets.add(mod)
        graph[name] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_anywhere() -> None:
    """The package reads bottom-up: no module reaches itself through its imports, type-only
    ones included (core: data, then handlers, then the dispatcher on top)."""
    cycles = _cycles(_import_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_cycle_finder_finds_a_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "raftsched" / "core"
    pkg.mkdir(parents=True)
    (tmp_path / "raftsched" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from raftsched.core import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from raftsched.core.c import X\n")
    (pkg / "c.py").write_text("def f():\n    from . import a\n")
    (pkg / "d.py").write_text("from raftsched.core import a\n")
    graph = _import_graph(tmp_path / "raftsched")
    assert _cycles(graph) == [["raftsched.core.a", "raftsched.core.b", "raftsched.core.c"]]


def test_the_client_does_not_load_the_state_machine() -> None:
    """A CLI call or an app's ``Client`` loads the framing and msgpack helpers, not the
    replicated state machine, its handlers or croniter."""
    code = ("import sys, raftsched.wire.client, raftsched.faces.cli\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith(('raftsched.core', "
            "'croniter')))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30, check=True).stdout.split()
    assert out, "the probe printed nothing"
    heavy = [m for m in out if m in ("raftsched.core.machine", "raftsched.core.state",
                                     "raftsched.core.claims", "raftsched.core.trigger")
             or m.startswith("croniter")]
    assert not heavy, f"loaded by the client: {heavy}"


# ------------------------------------------------------------------ node's rooms

#: The rooms of ``raftsched/node`` and the rooms each may import (its own included):
#: config at the bottom, then observe, the replica, the worker and the leader beside
#: each other, the service above them; the process root (``node/*.py``) wires them all.
ROOM_RULES = {
    "config": {"config"},
    "observe": {"observe", "config"},
    "replica": {"replica", "observe", "config"},
    "worker": {"worker", "replica", "observe", "config"},
    "leader": {"leader", "replica", "observe", "config"},
    "service": {"service", "leader", "worker", "replica", "observe", "config"},
}


def _room_of(module: str) -> str | None:
    """``raftsched.node.<room>.<module>`` -> the room; the process root -> None."""
    parts = module.split(".")
    return parts[2] if len(parts) == 4 and parts[:2] == ["raftsched", "node"] else None


def _room_breaches(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, targets in sorted(graph.items()):
        room = _room_of(module)
        if room is None or not module.startswith("raftsched.node."):
            continue
        for target in sorted(targets):
            if not target.startswith("raftsched.node."):
                continue
            other = _room_of(target)
            if other is None:
                out.append(f"{module} imports the process root's {target}")
            elif other not in ROOM_RULES[room]:
                out.append(f"{module} ({room}) imports {target} ({other})")
    return out


def test_every_node_module_sits_in_a_room_or_the_root() -> None:
    rooms = {p.name for p in (PKG / "node").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert rooms == set(ROOM_RULES), rooms
    for sub in (PKG / "node").iterdir():
        if sub.is_dir() and sub.name in rooms:
            nested = [p for p in sub.rglob("*.py") if p.parent != sub]
            assert not nested, f"rooms hold modules, not folders: {nested}"


def test_node_rooms_import_by_their_rules() -> None:
    """Type-only imports count: a room never names a higher room or the process root."""
    breaches = _room_breaches(_import_graph())
    assert not breaches, "\n".join(breaches)


def test_room_rules_catch_a_breach() -> None:
    graph = {"raftsched.node.replica.raft": {"raftsched.node.worker.worker"},
             "raftsched.node.observe.events": {"raftsched.node.node"},
             "raftsched.node.service.status": {"raftsched.node.worker.worker"},
             "raftsched.node.node": {"raftsched.node.service.status"}}
    assert _room_breaches(graph) == [
        "raftsched.node.observe.events imports the process root's raftsched.node.node",
        "raftsched.node.replica.raft (replica) imports raftsched.node.worker.worker (worker)"]
