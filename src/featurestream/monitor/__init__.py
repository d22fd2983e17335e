"""Trainer-side queue monitoring: status snapshots (``status``) and metrics for experiment trackers (``metrics``)."""
