"""The parts of ``featurestream.vllm`` that need no engine: the layer-id mapping, the sink registry, and the
refusal of a vLLM without ``extract_hidden_states`` (a stand-in ``vllm`` module: the real one has the method)."""

from __future__ import annotations

import sys
import types
import typing

import pytest

from featurestream.vllm import CapturedRequest, VLLMFeatureEngine, engine_layer_ids, register_sink, resolve_sink
from featurestream.vllm.sinks import unregister_sink


class _Sink:
    def __init__(self) -> None:
        self.delivered: list[CapturedRequest] = []

    def deliver(self, captured: CapturedRequest) -> None:
        self.delivered.append(captured)


def make_sink() -> _Sink:
    return _Sink()


def test_the_references_layer_ids_map_to_vllms_inputs_of_the_next_layer() -> None:
    # Reference id i is layer i's output = vLLM's id i + 1 (the input of layer i + 1); vLLM returns them ascending.
    assert engine_layer_ids([3, 0, 5]) == ([1, 4, 6], [1, 0, 2])
    assert engine_layer_ids([0, 1]) == ([1, 2], [0, 1])


def test_sinks_resolve_by_name_or_import_path_and_refuse_what_they_cannot_find() -> None:
    sink = _Sink()
    register_sink("checks", sink)
    try:
        assert resolve_sink("checks") is sink
        with pytest.raises(ValueError, match="'checks' is already registered"):
            register_sink("checks", _Sink())
    finally:
        unregister_sink("checks")
    with pytest.raises(LookupError, match="no featurestream sink named 'checks'"):
        resolve_sink("checks")
    assert isinstance(resolve_sink(f"{__name__}:make_sink"), _Sink)
    with pytest.raises(LookupError, match=r"'collections:OrderedDict' returned OrderedDict, which has no deliver"):
        resolve_sink("collections:OrderedDict")
    with pytest.raises(LookupError, match="'no_such_module:f' does not name an importable factory"):
        resolve_sink("no_such_module:f")
    with pytest.raises(ValueError, match="without ':'"):
        register_sink("a:b", _Sink())


def test_a_vllm_without_extract_hidden_states_is_refused_naming_its_version(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("vllm")
    fake.__version__ = "0.9.0"  # type: ignore[attr-defined]
    speculative = types.ModuleType("vllm.config.speculative")
    speculative.EagleModelTypes = typing.Literal["eagle", "eagle3"]  # type: ignore[attr-defined]
    for name, module in (
        ("vllm", fake),
        ("vllm.config", types.ModuleType("vllm.config")),
        (speculative.__name__, speculative),
    ):
        monkeypatch.setitem(sys.modules, name, module)
    with pytest.raises(ImportError, match=r"vLLM 0\.9\.0 has no 'extract_hidden_states' speculative method"):
        VLLMFeatureEngine("any-model", "dflash", [0])
    with pytest.raises(ValueError, match="algorithm 'eagle1' cannot be captured from vLLM"):
        VLLMFeatureEngine("any-model", "eagle1", [0])
