"""``VLLMFeatureEngine``: a vLLM engine that captures a DFlash (or EAGLE-3) target's layer states per request.

The engine runs vLLM's ``extract_hidden_states`` method with featurestream's
KV connector (``featurestream.vllm.connector``), in this process: each
finished request's states reach this engine's sink, which either returns them
to ``capture`` or, while ``stream`` runs, stores them as one sample and puts
its ref on the queue from inside the engine step (the queue's backpressure
stalls the engine).

Layer ids follow the reference: id ``i`` is the output of decoder layer
``i`` (Hugging Face ``hidden_states[i + 1]``; for the last layer its own
output, not the final norm's). vLLM's id ``j`` is the input of layer ``j``, so
the engine is asked for ``i + 1``; vLLM returns the layers in ascending order
and the engine puts them back in the order given.
"""

from __future__ import annotations

import os
import threading
import time
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from featurestream.common.errors import PutAborted, QueueClosed
from featurestream.common.refs import SampleRef
from featurestream.core.protocol import LeaseQueue
from featurestream.pipeline.hf_capture import check_layer_ids
from featurestream.pipeline.producer import FeatureProducer
from featurestream.vllm.sinks import PARAMS_KEY, SINK_KEY, CapturedRequest, register_sink, unregister_sink

__all__ = ["ALGORITHMS", "VLLMFeatureEngine", "engine_layer_ids"]

# algorithm -> (the reference's name for its layer ids, how many it takes: None for one or more).
ALGORITHMS: Mapping[str, tuple[str, int | None]] = {
    "dflash": ("target_layer_ids", None),
    "eagle3": ("aux_layer_ids", 3),
}
# What an EAGLE-3 sample needs that extract_hidden_states does not give.
EAGLE3_MISSING = (
    "an EAGLE-3 sample needs the target's supervision (its logits, or target_probs and position_mask), and vLLM's "
    "extract_hidden_states gives decoder-layer states only (never the final norm's output or the LM head's "
    "logits); featurestream.vllm streams DFlash samples, and captures EAGLE-3's aux hidden states only through "
    "VLLMFeatureEngine.capture"
)


def engine_layer_ids(layer_ids: Sequence[int]) -> tuple[list[int], list[int]]:
    """vLLM's ``eagle_aux_hidden_state_layer_ids`` for the reference's ``layer_ids`` (ascending, each plus one),
    and for each given id the index of its state in the engine's ascending order."""
    engine = sorted(i + 1 for i in layer_ids)
    return engine, [engine.index(i + 1) for i in layer_ids]


def _require_extract_hidden_states() -> Any:
    try:
        from vllm.config.speculative import EagleModelTypes

        import vllm
    except ImportError as exc:
        raise ImportError(f"featurestream.vllm needs vLLM: pip install 'featurestream[vllm]' ({exc})") from exc
    if "extract_hidden_states" not in typing.get_args(EagleModelTypes):
        raise ImportError(
            f"vLLM {vllm.__version__} has no 'extract_hidden_states' speculative method, which featurestream.vllm "
            "captures through; install the vLLM featurestream[vllm] pins (constraints/vllm.txt)"
        )
    return vllm


def _num_layers(model: str) -> int:
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model)
    except Exception as exc:
        raise ValueError(f"vLLM cannot load model {model!r} on this host: its config does not load ({exc})") from exc
    return int(config.get_text_config().num_hidden_layers)


class _Sink:
    """This engine's sink: hands a capture to the ``capture`` call waiting for it, or to the running stream."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._captured: dict[str, CapturedRequest] = {}
        self.stream: Callable[[CapturedRequest], None] | None = None

    def deliver(self, captured: CapturedRequest) -> None:
        stream = self.stream
        if stream is not None and captured.params.get("stream"):
            stream(captured)
            return
        with self._lock:
            self._captured[str(captured.params.get("key"))] = captured

    def take(self, key: str) -> CapturedRequest | None:
        with self._lock:
            return self._captured.pop(key, None)


class VLLMFeatureEngine:
    """An in-process vLLM ``LLM`` over ``model`` (a path or hub name) capturing ``algorithm``'s layer states.

    ``algorithm``: ``"dflash"`` (``layer_ids`` is the reference's
    ``target_layer_ids``, one or more) or ``"eagle3"`` (its ``aux_layer_ids``,
    three; ``capture`` only: see ``stream``). ``ValueError`` naming the value
    for another algorithm, a layer id out of range or repeated, or a model whose
    config does not load; ``RuntimeError`` naming the model when vLLM cannot
    build an engine for it here; ``ImportError`` for a vLLM without
    ``extract_hidden_states``. ``llm_kwargs`` go to ``vllm.LLM`` (``dtype``,
    ``max_model_len``, ``max_num_seqs`` ...). ``start_seconds``: how long
    building the engine took. The engine core runs in this process (this sets
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0``): its sink is this object's. Runs are
    serialised: one ``capture`` or ``stream`` at a time.
    """

    def __init__(self, model: str, algorithm: str, layer_ids: Sequence[int], **llm_kwargs: Any) -> None:
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm {algorithm!r} cannot be captured from vLLM; supported: {sorted(ALGORITHMS)}")
        vllm = _require_extract_hidden_states()
        name, count = ALGORITHMS[algorithm]
        self.model = model
        self.algorithm = algorithm
        self.num_layers = _num_layers(model)
        self.layer_ids = check_layer_ids(layer_ids, self.num_layers, name=name, count=count)
        self._engine_ids, self._order = engine_layer_ids(self.layer_ids)
        self._sink_name = f"engine-{uuid.uuid4().hex}"
        self._sink = _Sink()
        self._lock = threading.Lock()
        register_sink(self._sink_name, self._sink)
        # The sink lives in this process, so the engine core must too (vLLM reads this when it builds the engine).
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        started = time.monotonic()
        try:
            self.llm = vllm.LLM(**self.engine_args(self._sink_name), **llm_kwargs)
        except Exception as exc:
            unregister_sink(self._sink_name)
            raise RuntimeError(f"vLLM cannot load model {model!r} on this host: {type(exc).__name__}: {exc}") from exc
        self.start_seconds = time.monotonic() - started

    def engine_args(self, sink: str) -> dict[str, Any]:
        """The ``vllm.LLM`` / ``vllm serve`` engine arguments capturing this engine's layers into ``sink`` (a
        registered name, or ``"package.module:factory"`` for an engine in another process)."""
        return {
            "model": self.model,
            "speculative_config": {
                "method": "extract_hidden_states",
                "num_speculative_tokens": 1,
                "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": self._engine_ids}},
            },
            "kv_transfer_config": {
                "kv_connector": "FeatureStreamConnector",
                "kv_connector_module_path": "featurestream.vllm.connector",
                "kv_role": "kv_producer",
                "kv_connector_extra_config": {SINK_KEY: sink},
            },
            # A prefix-cache hit would skip the forward that writes the states of the cached tokens.
            "enable_prefix_caching": False,
        }

    def features(self, captured: CapturedRequest) -> torch.Tensor:
        """A capture's states as ``[T, len(layer_ids) * H]``, concatenated in the order of ``layer_ids``."""
        states = captured.states[:, self._order] if self._order != sorted(self._order) else captured.states
        return states.reshape(states.shape[0], -1)

    def capture(self, prompts: Sequence[Sequence[int]], *, timeout: float = 600.0) -> list[torch.Tensor]:
        """Each prompt's (token ids) states ``[T, len(layer_ids) * H]`` in the engine's dtype, in prompt order.
        ``TimeoutError`` when a capture is not delivered within ``timeout`` seconds."""
        keys = [uuid.uuid4().hex for _ in prompts]
        with self._lock:
            self._run(prompts, [{"key": key} for key in keys], timeout)
        found = [self._sink.take(key) for key in keys]
        missing = sum(captured is None for captured in found)
        if missing:
            raise RuntimeError(f"vLLM finished {len(keys)} requests but delivered the states of {len(keys) - missing}")
        return [self.features(captured) for captured in found if captured is not None]

    def stream(
        self,
        prompts: Sequence[tuple[torch.Tensor, torch.Tensor]],
        producer: FeatureProducer,
        queue: LeaseQueue,
        *,
        sample_ids: Sequence[str] | None = None,
        timeout: float = 600.0,
    ) -> list[SampleRef]:
        """Capture each ``(input_ids [T], loss_mask [T])`` prompt as one sample stored by ``producer`` (over a
        ``VLLMDFlashTarget`` of this engine) and put on ``queue`` from inside the engine step, as its request
        finishes; the refs enqueued, in the order their requests finished.

        A ref whose put is refused (queue closed) is discarded from the store and the rest are not enqueued. An
        error storing a sample is raised once the engine has finished the prompts; the samples stored before it
        stay enqueued. ``ValueError`` for EAGLE-3 (no supervision: ``EAGLE3_MISSING``) or a producer over another
        target.
        """
        from featurestream.vllm.target import VLLMDFlashTarget

        if self.algorithm != "dflash":
            raise ValueError(f"cannot stream {self.algorithm!r} samples from vLLM: {EAGLE3_MISSING}")
        target = producer.target_backend
        if not isinstance(target, VLLMDFlashTarget) or target.engine is not self:
            raise ValueError(f"producer must drive a VLLMDFlashTarget of this engine, got {type(target).__name__}")
        ids = list(sample_ids) if sample_ids is not None else [None] * len(prompts)
        if len(ids) != len(prompts):
            raise ValueError(f"sample_ids has {len(ids)} ids for {len(prompts)} prompts")
        pending = {uuid.uuid4().hex: (prompt, sample_id) for prompt, sample_id in zip(prompts, ids, strict=True)}
        refs: list[SampleRef] = []
        failed: list[BaseException] = []

        def deliver(captured: CapturedRequest) -> None:
            (input_ids, loss_mask), sample_id = pending[captured.params["key"]]
            if failed:
                return
            try:
                with target.replaying(self.features(captured)):
                    ref = producer.produce(
                        input_ids=input_ids[None],
                        attention_mask=torch.ones_like(input_ids)[None],
                        loss_mask=loss_mask[None],
                        sample_id=sample_id,
                    )
            except Exception as exc:
                failed.append(exc)
                return
            try:
                queue.put_blocks_until_below(ref, abort_when=lambda: queue.is_closed)
            except (QueueClosed, PutAborted) as exc:
                producer.discard(ref)
                failed.append(exc)
                return
            refs.append(ref)

        with self._lock:
            self._sink.stream = deliver
            try:
                self._run(
                    [prompt[0].tolist() for prompt, _ in pending.values()],
                    [{"key": key, "stream": True} for key in pending],
                    timeout,
                )
            finally:
                self._sink.stream = None
        if failed and not isinstance(failed[0], (QueueClosed, PutAborted)):
            raise failed[0]
        return refs

    def _run(self, prompts: Sequence[Sequence[int]], params: Sequence[dict[str, Any]], timeout: float) -> None:
        """Generate one token for each prompt, then step the engine until every request's states are delivered."""
        from vllm import SamplingParams, TokensPrompt

        sampling = [SamplingParams(max_tokens=1, extra_args={"kv_transfer_params": {PARAMS_KEY: p}}) for p in params]
        engine = self.llm.llm_engine
        self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], sampling, use_tqdm=False)
        deadline = time.monotonic() + timeout
        # A request's states are taken out on the engine step after it finished; the engine keeps stepping while
        # any finished request still holds its blocks.
        while engine.engine_core.engine_core.scheduler.has_requests():
            if time.monotonic() > deadline:
                raise TimeoutError(f"vLLM did not deliver the captured states within {timeout} s")
            engine.step()

    def close(self) -> None:
        """Unregister the sink and shut the engine down (idempotent)."""
        unregister_sink(self._sink_name)
        shutdown = getattr(self.llm.llm_engine.engine_core, "shutdown", None)
        if callable(shutdown):
            shutdown()
