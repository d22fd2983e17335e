"""Tooling: the end-to-end demo and its tiny models, and the state-diagram renderer.

The operator commands moved to ``featurestream.ops`` and the trainer-side status and metrics to
``featurestream.monitor``; ``featurestream.tools.ops``, ``.status`` and ``.metrics`` are aliases of them.
"""
