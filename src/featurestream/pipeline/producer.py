"""``FeatureProducer``: one target forward per call, its supervision put into a feature store."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Protocol

import torch

from featurestream.core.refs import FeatureAlgorithm, SampleRef
from featurestream.pipeline import eagle3
from featurestream.stores.base import FeatureStore
from featurestream.stores.ledger import LedgerFeatureStore

__all__ = ["FeatureProducer", "TargetBackend"]


class TargetBackend(Protocol):
    """What a producer drives: a target model that computes EAGLE-3 supervision.

    ``generate_batch`` receives ``input_ids``, ``attention_mask`` and
    ``loss_mask`` as keywords (plus ``position_ids``, ``seq_lens`` and
    ``doc_remaining`` when packing) and returns an object (or mapping) with
    ``aux_hidden_states, input_ids, attention_mask, loss_mask`` and either
    ``logits`` or ``target_probs`` + ``position_mask``.
    """

    def generate_batch(self, **inputs: torch.Tensor) -> object: ...


class FeatureProducer:
    """Run the target backend on prompts and put its outputs in ``store``.

    ``produce`` returns the ``SampleRef`` to enqueue; a ref that will never be
    enqueued must be handed to ``discard``. Default sample ids are
    ``sample-{run_id}-{n}`` (``n`` from 0); ``sample_id_factory()`` replaces them.

    Copies: the backend's freshly computed outputs are handed to the store
    without a copy (``put(..., take_ownership=True)`` on the built-in stores),
    so the backend must return new tensors on each call, not buffers it
    reuses. Outputs that share memory with the caller's inputs (a backend may
    echo ``input_ids`` back) are copied, because the caller still owns those.
    """

    def __init__(
        self,
        target_backend: TargetBackend,
        store: FeatureStore,
        *,
        run_id: str,
        algorithm: FeatureAlgorithm | None = None,
        target_model_version: str = "0",
        draft_weight_version: str = "0",
        sample_id_factory: Callable[[], str] | None = None,
    ) -> None:
        if not callable(getattr(target_backend, "generate_batch", None)):
            raise TypeError(
                f"target_backend must have a generate_batch(...) method, got {type(target_backend).__name__}"
            )
        if not isinstance(store, FeatureStore):
            raise TypeError(f"store must be a FeatureStore, got {type(store).__name__}")
        if not isinstance(run_id, str) or not run_id:
            raise ValueError(f"run_id must be a non-empty str, got {run_id!r}")
        algorithm = eagle3.require_eagle3(algorithm, "FeatureProducer")
        self.target_backend = target_backend
        self.store = store
        self.run_id = run_id
        self.algorithm = algorithm
        self.target_model_version = target_model_version
        self.draft_weight_version = draft_weight_version
        self._sample_id_factory = sample_id_factory
        self._counter = itertools.count()
        self._counter_lock = threading.Lock()

    def produce(
        self,
        *,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        loss_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
        doc_remaining: torch.Tensor | None = None,
    ) -> SampleRef:
        """One no-grad target forward; store its supervision and return the ref describing it."""
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}
        packing = {"position_ids": position_ids, "seq_lens": seq_lens, "doc_remaining": doc_remaining}
        inputs.update({name: value for name, value in packing.items() if value is not None})
        with torch.no_grad():
            batch = self.target_backend.generate_batch(**inputs)
        tensors = eagle3.feature_tensors(batch)
        for name, tensor in tensors.items():
            if any(_shares_memory(tensor, given) for given in inputs.values()):
                tensors[name] = tensor.clone()
        put_options = {"take_ownership": True} if isinstance(self.store, LedgerFeatureStore) else {}
        return self.store.put(
            self._next_sample_id(),
            tensors,
            run_id=self.run_id,
            algorithm=self.algorithm,
            schema_version=eagle3.SCHEMA_VERSION,
            target_model_version=self.target_model_version,
            draft_weight_version=self.draft_weight_version,
            num_tokens=int(attention_mask.sum()),
            **put_options,
        )

    def discard(self, ref: SampleRef) -> None:
        """Evict a produced sample that will never be enqueued (so it is not orphaned in the store)."""
        self.store.scrub(ref)

    def _next_sample_id(self) -> str:
        if self._sample_id_factory is not None:
            return self._sample_id_factory()
        with self._counter_lock:
            return f"sample-{self.run_id}-{next(self._counter)}"


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    if not isinstance(b, torch.Tensor) or a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
