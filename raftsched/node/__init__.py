"""One node's runtime: the Raft adapter, the node's wiring, the leader loop, the
worker pool and what executes runs, the guard, metrics, events and the config.

Edges around the pure core: the wall clock is read here and stamped into commands.
"""
