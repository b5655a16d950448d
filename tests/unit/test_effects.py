"""Every effect the state machine emits has a consumer on the node, and nothing
consumes a kind that does not exist (a renamed kind once left a waker that never
fired)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from raftsched.core import effects

pytestmark = pytest.mark.timeout(60)

PKG = Path(__file__).resolve().parents[2] / "raftsched"
#: The modules that consume effects.
CONSUMERS = ("node/node.py", "node/observe/eventpolicy.py", "node/metrics.py",
             "node/observe/events.py")
#: The modules that emit them.
EMITTERS = ("core/runs.py", "core/jobs.py", "core/nodes.py", "core/claims.py",
            "core/notify.py", "core/members.py", "core/deps.py", "core/backfill.py",
            "node/replica/raft.py", "node/replica/replica.py")


def _names(paths: tuple[str, ...], *, consumed: bool) -> set[str]:
    """Effect class names consumed in ``paths`` (matched ``case X(...)``, or named in
    code other than imports: ``isinstance`` checks, dispatch tables) or emitted there
    (``X(...)`` calls)."""
    found: set[str] = set()
    for rel in paths:
        tree = ast.parse((PKG / rel).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if consumed and isinstance(node, ast.MatchClass):
                found.add(ast.unparse(node.cls).rsplit(".", 1)[-1])
            elif consumed and isinstance(node, ast.Name):
                found.add(node.id)
            elif consumed and isinstance(node, ast.Attribute):
                found.add(node.attr)
            elif not consumed and isinstance(node, ast.Call):
                found.add(ast.unparse(node.func).rsplit(".", 1)[-1])
    return found & {cls.__name__ for cls in effects.EFFECTS}


def test_every_effect_kind_has_a_consumer() -> None:
    kinds = {cls.__name__ for cls in effects.EFFECTS}
    assert kinds - _names(CONSUMERS, consumed=True) == set()


def test_every_effect_kind_is_emitted() -> None:
    kinds = {cls.__name__ for cls in effects.EFFECTS}
    assert kinds - _names(EMITTERS, consumed=False) == set()


def test_effects_module_lists_every_kind() -> None:
    tree = ast.parse((PKG / "core/effects.py").read_text(encoding="utf-8"))
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    assert classes == {cls.__name__ for cls in effects.EFFECTS}


def test_the_scan_sees_a_missing_consumer(tmp_path: Path) -> None:
    """The scanner itself: a consumer module without a case for a kind misses it."""
    src = tmp_path / "c.py"
    src.write_text("from raftsched.core.effects import NodeBack\n"
                   "def f(e):\n    match e:\n        case JobPut(): pass\n"
                   "    return isinstance(e, (effects.NodeLost, Restored))\n")
    global PKG
    old = PKG
    PKG = tmp_path
    try:
        assert _names(("c.py",), consumed=True) == {"JobPut", "NodeLost", "Restored"}
    finally:
        PKG = old
