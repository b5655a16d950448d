"""Structured events, the live feed, loop snapshots, the collector's watch and the wall
clock: every room may use them."""
