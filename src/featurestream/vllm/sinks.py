"""Where the KV connector hands captured states: sinks, named in a process-local registry or by import path.

This module does not import vLLM: the front end registers its sink before it
builds the engine, and the connector resolves the name in the worker.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["CapturedRequest", "StateSink", "register_sink", "resolve_sink", "unregister_sink"]

SINK_KEY = "featurestream_sink"
PARAMS_KEY = "featurestream"


class CapturedRequest:
    """One finished request's capture: its ``token_ids [T]``, the engine's ``states [T, L, H]`` (vLLM's layer
    order, ascending ids) and the ``params`` the request carried under ``kv_transfer_params["featurestream"]``."""

    __slots__ = ("params", "request_id", "states", "token_ids")

    def __init__(
        self, request_id: str, token_ids: torch.Tensor, states: torch.Tensor, params: Mapping[str, Any]
    ) -> None:
        self.request_id = request_id
        self.token_ids = token_ids
        self.states = states
        self.params = params


@runtime_checkable
class StateSink(Protocol):
    """What the connector calls once per finished request, in the worker, before the request's blocks are freed.

    ``deliver`` may block (that is the engine's backpressure); an exception it
    raises is logged by the connector and the request's blocks are freed.
    """

    def deliver(self, captured: CapturedRequest) -> None: ...


_lock = threading.Lock()
_sinks: dict[str, StateSink] = {}


def register_sink(name: str, sink: StateSink) -> None:
    """Make ``sink`` the one a connector configured with ``featurestream_sink=name`` delivers to in this process.
    ``ValueError`` when ``name`` is taken or contains ``:`` (which marks an import path)."""
    if not isinstance(sink, StateSink):
        raise TypeError(f"sink must have a deliver(captured) method, got {type(sink).__name__}")
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"a sink name must be a non-empty str without ':', got {name!r}")
    with _lock:
        if name in _sinks:
            raise ValueError(f"a sink named {name!r} is already registered in this process")
        _sinks[name] = sink


def unregister_sink(name: str) -> None:
    """Forget the sink registered as ``name`` (no-op when there is none)."""
    with _lock:
        _sinks.pop(name, None)


def resolve_sink(spec: str) -> StateSink:
    """The sink ``spec`` names: a name registered in this process, or ``"package.module:factory"``, a callable
    taking no arguments that returns a sink (for an engine in another process, such as ``vllm serve``).

    ``LookupError`` naming ``spec`` when neither finds one.
    """
    if ":" not in spec:
        with _lock:
            sink = _sinks.get(spec)
        if sink is None:
            raise LookupError(
                f"no featurestream sink named {spec!r} in this process (pid-local registry): an engine run in its "
                "own process (VLLM_ENABLE_V1_MULTIPROCESSING=1, vllm serve) needs featurestream_sink="
                "'package.module:factory' instead"
            )
        return sink
    module_name, _, attribute = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise LookupError(f"featurestream_sink {spec!r} does not name an importable factory: {exc}") from exc
    sink = factory()
    if not isinstance(sink, StateSink):
        raise LookupError(f"featurestream_sink {spec!r} returned {type(sink).__name__}, which has no deliver()")
    return sink
