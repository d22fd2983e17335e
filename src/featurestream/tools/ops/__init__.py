"""Operator commands for a shared Redis queue: ``featurestream status`` and ``featurestream dead-letters``."""
