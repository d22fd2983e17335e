"""Tooling: the end-to-end demo and its tiny models, the state-diagram renderer, and the local servers the demo,
the tests and the benchmarks start (``servers``: a process on free loopback ports; ``mooncake``: a
``mooncake_master``).
"""
