"""The pure core: job specs, the time trigger, the miss detector, the replicated state
machine, the leader's planning and their encodings.

Nothing here reads a clock, does I/O, starts threads or imports anything outside
``raftsched.core`` (``tests/unit/test_layering.py`` enforces it): every replica must
compute the same answers from the same log.
"""
