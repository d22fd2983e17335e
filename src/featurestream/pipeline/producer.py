"""``FeatureProducer``: one target forward per call, its supervision put into a feature store."""

from __future__ import annotations

import inspect
import itertools
import threading
import typing
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

import torch

from featurestream.common.checks import check_flag
from featurestream.common.refs import FeatureAlgorithm, FeatureSpec, SampleRef, algorithm_name
from featurestream.pipeline.fp8 import quantize
from featurestream.pipeline.schemas import AlgorithmSchema, registered_schemas, schema_for
from featurestream.pipeline.supervision import HiddenSupervised, stored_tensors
from featurestream.stores.base import FeatureStore

__all__ = ["FeatureProducer", "TargetBackend"]

_PACKING_INPUTS = ("position_ids", "seq_lens", "doc_remaining")


class TargetBackend(Protocol):
    """What a producer drives: a target model that computes an algorithm's supervision.

    ``generate_batch`` receives ``input_ids``, ``attention_mask``,
    ``loss_mask``, ``position_ids``, ``seq_lens`` and ``doc_remaining`` as
    keywords (the last three ``None`` unless packing; a ``generate_batch``
    that does not declare them gets the first three only) and returns an
    object (or mapping) with the schema's features; for EAGLE-3
    ``aux_hidden_states, input_ids, attention_mask, loss_mask`` and the
    supervision, ``logits`` or ``target_probs, position_mask``. A
    ``featurestream.pipeline.supervision.HiddenSupervised`` instead stores
    the target's last hidden state for the trainer to rebuild the logits
    from (the ref's ``provenance`` says so). The algorithm is inferred from the backend's base class (for EAGLE-3,
    ``featurestream.eagle3.Eagle3TargetBackend`` or the reference package's
    ``Eagle3TargetBackend``), else from the batch class ``generate_batch``
    is annotated to return (featurestream's or the reference's: the
    reference's ``HFDFlashTargetModel`` returns a ``DFlashTargetBatch``);
    any other backend needs ``FeatureProducer(..., algorithm=...)``.
    """

    def generate_batch(self, **inputs: torch.Tensor | None) -> object: ...


class FeatureProducer:
    """Run the target backend on prompts and put its outputs in ``store``.

    The algorithm's ``AlgorithmSchema`` (``featurestream.pipeline.schemas``)
    decides what is stored: with ``algorithm=None`` it is inferred from the
    backend's class (an ``Eagle3TargetBackend`` is EAGLE-3) or from the
    batch class its ``generate_batch`` is annotated to return, else
    ``ValueError`` (``cannot infer FeatureAlgorithm``). A user algorithm
    (``register_algorithm``) is named by its ``str``.

    The reference's attributes keep their meaning: ``_target`` (the
    backend), ``_store`` and ``_algorithm``; ``target_backend``, ``store``
    and ``algorithm`` read the same.

    ``produce`` returns the ``SampleRef`` to enqueue; a ref that will never be
    enqueued must be handed to ``discard``. Sample ids are
    ``sample_id_factory(n)`` for the 1-based sequence number ``n``, by default
    ``sample-{run_id}-{n}``. ``num_tokens`` on the ref is the number of
    supervised tokens, ``int(loss_mask.sum())``.

    Copies: when the store's ``put`` declares ``take_ownership`` (the
    built-in stores do) the backend's freshly computed outputs are handed
    over without a copy, so the backend must return new tensors on each
    call, not buffers it reuses. Outputs that share memory with the caller's
    inputs (a backend may echo ``input_ids`` back) are copied, because the
    caller still owns those. A store without the keyword (written against the
    reference contract) is called without it and copies as it likes.

    ``fp8=True`` (lossy, off by default) stores the hidden-state features as
    ``float8_e4m3fn`` with per-token scales (``featurestream.pipeline.fp8``);
    the loader dequantises them to the dtype the backend gave.

    Thread-safe: concurrent ``produce`` calls get distinct ids (the backend
    itself must tolerate concurrent forwards if they are made).
    """

    def __init__(
        self,
        target_backend: TargetBackend,
        store: FeatureStore,
        *,
        run_id: str,
        algorithm: FeatureAlgorithm | str | None = None,
        target_model_version: str = "0",
        draft_weight_version: str = "0",
        sample_id_factory: Callable[[int], str] | None = None,
        fp8: bool = False,
    ) -> None:
        # The run_id comes first, as in the reference: a recipe's bad run_id is reported whatever its backend.
        if not isinstance(run_id, str) or not run_id:
            raise ValueError(f"run_id must be a non-empty str, got {run_id!r}")
        schema = _infer_schema(target_backend) if algorithm is None else schema_for(algorithm)
        if not callable(getattr(target_backend, "generate_batch", None)):
            raise TypeError(
                f"target_backend must have a generate_batch(...) method, got {type(target_backend).__name__}"
            )
        if not isinstance(store, FeatureStore):
            raise TypeError(f"store must be a FeatureStore, got {type(store).__name__}")
        check_flag("fp8", fp8)
        if sample_id_factory is not None and not callable(sample_id_factory):
            raise TypeError(f"sample_id_factory must be callable as factory(n) -> str, got {sample_id_factory!r}")
        self._target = target_backend
        self._store = store
        self.run_id = run_id
        self.schema: AlgorithmSchema = schema
        self._algorithm = schema.algorithm
        self._algorithm_given = algorithm is not None
        self.target_model_version = target_model_version
        self.draft_weight_version = draft_weight_version
        self._sample_id_factory = sample_id_factory
        self.fp8 = fp8
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self._closed = False
        # Decided once: the keyword is an allowance a store declares, and reference-contract stores lack it.
        self._take_ownership = _accepts_keyword(store.put, "take_ownership")
        # A backend whose generate_batch takes no packing keywords (the reference's remote EAGLE-3 client) is
        # called with the three inputs it takes.
        self._packing_keywords = _accepts_keywords(target_backend.generate_batch, _PACKING_INPUTS)

    @property
    def target_backend(self) -> TargetBackend:
        """The target backend this producer drives (the reference's ``_target``)."""
        return self._target

    @property
    def store(self) -> FeatureStore:
        """The store every ``produce`` puts into (the reference's ``_store``)."""
        return self._store

    @property
    def algorithm(self) -> FeatureAlgorithm | str:
        """The algorithm of every sample this producer stores (the reference's ``_algorithm``)."""
        return self._algorithm

    # -- the backend's extras -----------------------------------------------------
    def set_vocab_mapping(self, selected_token_ids: torch.Tensor, selected_token_mask: torch.Tensor) -> None:
        """Forward the draft-vocabulary mapping to the target backend."""
        self.target_backend.set_vocab_mapping(selected_token_ids, selected_token_mask)  # type: ignore[attr-defined]

    def get_input_embeddings(self) -> torch.nn.Module:
        """The target backend's input embeddings (a draft head may share them)."""
        return self.target_backend.get_input_embeddings()  # type: ignore[attr-defined,no-any-return]

    # -- producing -------------------------------------------------------------------
    def produce(
        self,
        *,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        loss_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
        doc_remaining: torch.Tensor | None = None,
        sample_id: str | None = None,
    ) -> SampleRef:
        """One no-grad target forward; store its supervision and return the ref describing it.

        ``sample_id`` names the sample instead of the producer's sequence (a
        resumable producer names each sample by its prompt key).

        Errors: ``input_ids`` that is no ``[batch, tokens]`` tensor, or masks
        of another shape -> ``ValueError`` (``TypeError`` for a non-tensor)
        before the forward; inputs the schema refuses (EAGLE-3: partial
        packing metadata) -> ``ValueError`` before the forward; a backend output the schema
        refuses (EAGLE-3: no supervision) -> ``ValueError``, nothing stored;
        packing metadata for a backend whose ``generate_batch`` takes none ->
        ``ValueError`` before the forward;
        a required feature missing from the output, or a dtype or shape
        outside its rules -> ``ValueError`` naming the sample and the
        feature, nothing stored; an output of another algorithm's batch
        class -> ``ValueError`` naming both, nothing stored; a store whose
        ref (``feature_specs``) describes the tensors differently from what was put
        -> the sample is evicted and ``RuntimeError``; after ``close()`` ->
        ``RuntimeError``.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError(f"FeatureProducer for run {self.run_id!r} is closed")
        inputs = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "loss_mask": loss_mask,
            "position_ids": position_ids,
            "seq_lens": seq_lens,
            "doc_remaining": doc_remaining,
        }
        _check_prompt(input_ids, attention_mask, loss_mask)
        self.schema.check_inputs(inputs)
        if not self._packing_keywords:
            given = [name for name in _PACKING_INPUTS if inputs.pop(name) is not None]
            if given:
                raise ValueError(
                    f"{type(self.target_backend).__name__}.generate_batch takes no packing metadata, but {given} "
                    "were given: pass unpacked batches to this backend"
                )
        with torch.no_grad():
            batch = self.target_backend.generate_batch(**inputs)
        where = f"sample {sample_id!r}" if sample_id is not None else f"run {self.run_id!r}'s next sample"
        if not isinstance(batch, HiddenSupervised) and not self.schema.is_batch_type(type(batch)):
            self._check_not_another_algorithms(batch, where)
        try:
            tensors, provenance = stored_tensors(self.schema, batch)
            if self.fp8:
                tensors, quantized = quantize(tensors)
                provenance.update(quantized)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{where}: {exc}; nothing was stored") from None
        if self._take_ownership:
            for name, tensor in tensors.items():
                if any(_shares_memory(tensor, given) for given in inputs.values() if given is not None):
                    tensors[name] = tensor.clone()
        measured = {name: FeatureSpec(tuple(t.shape), t.dtype) for name, t in tensors.items()}
        options: dict[str, Any] = {"take_ownership": True} if self._take_ownership else {}
        if provenance:
            if not _accepts_keywords(self.store.put, ("provenance",)):
                raise TypeError(
                    f"{where}: {type(self.store).__name__}.put takes no provenance=, which a hidden-state-supervised "
                    "sample needs on its ref; use a featurestream store; nothing was stored"
                )
            options["provenance"] = provenance
        ref = self.store.put(
            self._next_sample_id() if sample_id is None else sample_id,
            tensors,
            run_id=self.run_id,
            algorithm=self.algorithm,
            schema_version=self.schema.schema_version,
            target_model_version=self.target_model_version,
            draft_weight_version=self.draft_weight_version,
            num_tokens=int(loss_mask.sum()),
            **options,
        )
        if dict(ref.feature_specs) != measured:
            mismatch = (
                f"sample {ref.sample_id!r}: SampleRef.feature_specs does not match what the producer measured: the "
                f"store's ref describes {_describe(ref.feature_specs)}, but the tensors put were {_describe(measured)}"
            )
            try:
                self.discard(ref)
            except Exception as exc:
                raise RuntimeError(f"{mismatch}; evicting it from {ref.store_uri} failed too: {exc!r}") from exc
            raise RuntimeError(f"{mismatch}; the sample was evicted from {ref.store_uri}")
        return ref

    def _check_not_another_algorithms(self, batch: object, where: str) -> None:
        """``ValueError`` naming both algorithms when ``batch`` is another algorithm's batch class."""
        for schema in registered_schemas().values():
            if schema is not self.schema and schema.is_batch_type(type(batch)):
                chosen = "algorithm=" if self._algorithm_given else "inferred from the backend: "
                raise ValueError(
                    f"{where}: FeatureProducer stores {algorithm_name(self.algorithm)!r} samples ({chosen}"
                    f"{self.algorithm!r}), but {type(self.target_backend).__name__}.generate_batch returned a "
                    f"{type(batch).__qualname__}, a {algorithm_name(schema.algorithm)!r} batch; nothing was stored "
                    f"(pass algorithm={algorithm_name(schema.algorithm)!r} or use a matching backend)"
                )

    def discard(self, ref: SampleRef) -> None:
        """Evict a produced sample that will never be enqueued (so it is not orphaned in the store).

        Stores with the ``scrub`` hook free it at once; a reference-contract
        store (no ``scrub``) frees an unqueued sample on its last release, so
        it is fetched and released.
        """
        if type(self.store).scrub is not FeatureStore.scrub:
            self.store.scrub(ref)
            return
        _, handle = self.store.get(ref)
        self.store.release(handle)

    def close(self) -> None:
        """Refuse later ``produce`` calls (idempotent); the store and the backend stay open (others share them)."""
        with self._lock:
            self._closed = True

    def __enter__(self) -> FeatureProducer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _next_sample_id(self) -> str:
        with self._lock:
            n = next(self._counter)
        if self._sample_id_factory is not None:
            return self._sample_id_factory(n)
        return f"sample-{self.run_id}-{n}"


def _infer_schema(backend: object) -> AlgorithmSchema:
    """The schema whose backend base class ``backend`` is an instance of, else the one whose batch class its
    ``generate_batch`` is annotated to return; ``ValueError`` when neither says."""
    schemas = registered_schemas().values()
    for schema in schemas:
        if schema.is_backend(backend):
            return schema
    returned = _returned_class(backend)
    for schema in schemas:
        if schema.is_batch_type(returned):
            return schema
    bases = ", ".join(
        f"{name} for {s.algorithm}"
        for s in schemas
        for name in (
            None if s.backend_type is None else f"{s.backend_type.__module__}.{s.backend_type.__qualname__}",
            s.reference_backend_type,
        )
        if name is not None
    )
    raise ValueError(
        f"cannot infer FeatureAlgorithm for target_backend of type {type(backend).__name__}: it subclasses none "
        f"of the algorithms' backend base classes ({bases}) and its generate_batch is not annotated to return an "
        "algorithm's batch class; subclass one, or pass algorithm= explicitly"
    )


def _returned_class(backend: object) -> object:
    """The class ``backend.generate_batch`` is annotated to return (resolved in its module), or ``None``."""
    method = getattr(backend, "generate_batch", None)
    if method is None:
        return None
    try:
        return typing.get_type_hints(method).get("return")
    except Exception:  # an annotation that does not resolve says nothing about the algorithm
        return None


def _accepts_keyword(function: Callable[..., object], name: str) -> bool:
    """Whether ``function`` declares a parameter ``name`` that can be passed by keyword."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return False
    parameter = parameters.get(name)
    return parameter is not None and parameter.kind in (parameter.KEYWORD_ONLY, parameter.POSITIONAL_OR_KEYWORD)


def _accepts_keywords(function: Callable[..., object], names: tuple[str, ...]) -> bool:
    """Whether ``function`` can be passed every one of ``names`` by keyword (a ``**kwargs`` takes any; a callable
    without a signature is assumed to)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return True
    if any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters):
        return True
    return all(_accepts_keyword(function, name) for name in names)


def _describe(specs: Any) -> str:
    return ", ".join(f"{name} {tuple(spec.shape)}/{spec.dtype}" for name, spec in specs.items())


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    if not isinstance(b, torch.Tensor) or a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _check_prompt(input_ids: object, attention_mask: object, loss_mask: object) -> None:
    """A prompt is a ``[batch, tokens]`` ``input_ids`` tensor with masks of its shape: refuse any other before the
    forward, naming what was given (a target's forward would fail inside the model with no word of why)."""
    given = {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}
    for name, tensor in given.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape [batch, tokens], got {type(tensor).__name__}")
    assert isinstance(input_ids, torch.Tensor)
    if input_ids.dim() != 2:
        hint = " (add the batch dimension: input_ids.unsqueeze(0))" if input_ids.dim() == 1 else ""
        raise ValueError(
            f"input_ids must be [batch, tokens], got shape {tuple(input_ids.shape)}{hint}; nothing was run or stored"
        )
    for name in ("attention_mask", "loss_mask"):
        shape = tuple(given[name].shape)  # type: ignore[union-attr]
        if shape != tuple(input_ids.shape):
            raise ValueError(
                f"{name} has shape {shape} but input_ids {tuple(input_ids.shape)}: they must match; "
                "nothing was run or stored"
            )
