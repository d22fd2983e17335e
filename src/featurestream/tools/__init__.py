"""Tooling: the end-to-end demo and its tiny models, and the state-diagram renderer."""
