"""The sets that let a run's effects skip a match are the match's own cases: a case
added to ``Node._act_on`` or a follower's case added to ``eventpolicy.emit_for``
without its set would silently never run."""

from __future__ import annotations

import ast
import inspect
import textwrap

from raftsched.node import node
from raftsched.node.observe import eventpolicy


def _cases(func: object) -> list[tuple[set[str], ast.expr | None]]:
    """(class names a case matches, its guard) for each case of ``func``'s match."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))  # type: ignore[arg-type]
    match = next(n for n in ast.walk(tree) if isinstance(n, ast.Match))
    out = []
    for case in match.cases:
        pats = case.pattern.patterns if isinstance(case.pattern, ast.MatchOr) \
            else [case.pattern]
        names = {p.cls.id for p in pats if isinstance(p, ast.MatchClass)
                 and isinstance(p.cls, ast.Name)}
        out.append((names, case.guard))
    return out


def _names(kinds: frozenset[type]) -> set[str]:
    return {k.__name__ for k in kinds}


def test_the_effects_a_node_acts_on_are_exactly_its_cases() -> None:
    cased = set().union(*(names for names, _ in _cases(node.Node._act_on)))
    assert cased == _names(node._NODE_ACTS)


def test_a_follower_reaches_exactly_the_cases_not_kept_for_the_leader() -> None:
    def for_any_node(guard: ast.expr | None) -> bool:
        return guard is None or not any(isinstance(n, ast.Name) and n.id == "leads"
                                        for n in ast.walk(guard))

    cases = _cases(eventpolicy.emit_for)
    assert cases, "emit_for has no match"
    anywhere = set().union(*(names for names, guard in cases if for_any_node(guard)))
    assert anywhere == _names(eventpolicy._ANY_NODE)
