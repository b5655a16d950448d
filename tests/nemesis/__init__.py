"""The nemesis: real network partitions, process and clock faults against a cluster in
network namespaces, and a Chronos-style checker (issue 14). ``python -m tests.nemesis``
runs it by hand; ``test_nemesis.py`` runs a short seeded round in the suite."""
