"""Capture target features from a live vLLM engine (optional extra ``featurestream[vllm]``).

``VLLMFeatureEngine`` builds a vLLM ``LLM`` running the ``extract_hidden_states``
method with ``FeatureStreamConnector`` (``featurestream.vllm.connector``), the
KV connector that hands each finished request's states to a featurestream
sink; ``VLLMDFlashTarget`` is a DFlash target backend over it, so
``FeatureProducer``, ``AsyncFeaturePipeline`` and ``ResumableProducer`` drive
it as any target; ``VLLMFeatureEngine.stream`` stores each finished request as
one sample and puts its ref on a queue from inside the engine step. The guide:
``docs/vllm.md``.
"""

from featurestream.vllm.engine import ALGORITHMS, EAGLE3_MISSING, VLLMFeatureEngine, engine_layer_ids
from featurestream.vllm.sinks import CapturedRequest, StateSink, register_sink, resolve_sink, unregister_sink
from featurestream.vllm.target import VLLMDFlashTarget

__all__ = [
    "ALGORITHMS",
    "EAGLE3_MISSING",
    "CapturedRequest",
    "StateSink",
    "VLLMDFlashTarget",
    "VLLMFeatureEngine",
    "engine_layer_ids",
    "register_sink",
    "resolve_sink",
    "unregister_sink",
]
