"""A job's callable resolved while its module is still being imported by another thread
(the embedded pattern: the app's module defines the job, then calls ``start()`` at import
and waits there for the node). Importing it on the node's loop waited for that import to
end, and the import waited for the loop: the gunicorn example's holder worker hung for
its whole start timeout and failed to boot (seen in a loaded CI run)."""

from __future__ import annotations

import importlib
import sys
import threading

import pytest

from raftsched.node.worker.executor import resolve_callable

pytestmark = pytest.mark.timeout(60)

MODULE = '''
import builtins


def job(ctx):
    return "ran"


builtins._raftsched_test_gate.wait(30)  # start() waiting for the node, in the real app


def later(ctx):
    return "later"
'''


def test_a_callable_of_a_module_being_imported_resolves_without_waiting(tmp_path) -> None:
    import builtins

    name = "raftsched_test_importing_app"
    (tmp_path / f"{name}.py").write_text(MODULE, encoding="utf-8")
    gate = threading.Event()
    builtins._raftsched_test_gate = gate  # type: ignore[attr-defined]
    sys.path.insert(0, str(tmp_path))
    importer = threading.Thread(target=importlib.import_module, args=(name,), daemon=True)
    try:
        importer.start()
        # Until the import has reached the gate: ``job`` defined, ``later`` not yet (the
        # module is in sys.modules from the first line of its body, before ``job``).
        for _ in range(1000):
            if hasattr(sys.modules.get(name), "job"):
                break
            threading.Event().wait(0.01)
        assert hasattr(sys.modules.get(name), "job"), "the import never reached its gate"
        got: dict[str, object] = {}

        def resolve() -> None:
            got["job"] = resolve_callable(f"{name}:job", None)
            try:
                resolve_callable(f"{name}:later", None)
            except ImportError as exc:
                got["later"] = str(exc)

        resolver = threading.Thread(target=resolve, daemon=True)
        resolver.start()
        resolver.join(5.0)
        assert not resolver.is_alive(), "resolving waited for the module's import to end"
        assert got["job"](None) == "ran"  # type: ignore[operator]
        assert "still being imported" in str(got["later"])
    finally:
        gate.set()
        importer.join(10)
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)
        del builtins._raftsched_test_gate  # type: ignore[attr-defined]
        resolve_callable.cache_clear()
