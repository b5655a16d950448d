"""raftsched benchmark suite: ``python -m bench [--quick] [--only W1,...] [--out DIR]``.

Kept import-light on purpose: node processes import ``bench.noop`` for the no-op
callables, and that must not pull in matplotlib or APScheduler.
"""
