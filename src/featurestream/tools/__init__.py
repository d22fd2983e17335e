"""Tooling: the end-to-end demo and its tiny models, the state-diagram renderer, and the local servers the demo,
the tests and the benchmarks start (``servers``: a process on free loopback ports; ``mooncake``: a
``mooncake_master``). ``featurestream.testing.servers`` and ``.mooncake`` are aliases of those two.

The operator commands moved to ``featurestream.ops`` and the trainer-side status and metrics to
``featurestream.monitor``; ``featurestream.tools.ops``, ``.status`` and ``.metrics`` are aliases of them.
"""
