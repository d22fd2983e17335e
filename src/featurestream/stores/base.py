"""The data plane contract: where a ``SampleRef``'s tensors live."""

from __future__ import annotations

import abc
import dataclasses
import inspect
import itertools
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import torch

from featurestream.common.errors import FeatureStreamError
from featurestream.common.refs import FeatureAlgorithm, SampleRef

__all__ = ["REF_FIELD_DEFAULTS", "FeatureStore", "SampleLostError", "StoreHandle", "StoreHealth", "new_handle_id"]

# ``next`` on an ``itertools.count`` is atomic in CPython, so ids are unique across threads without a lock.
_handle_ids = itertools.count(1)


def new_handle_id() -> int:
    """A process-wide unique handle id (what ``StoreHandle`` gets when none is given)."""
    return next(_handle_ids)


class SampleLostError(FeatureStreamError, KeyError):
    """A sample a ref names is gone from a store that never freed it on purpose (its bytes were lost).

    Its owner process died, the store evicted it, or the store's server
    restarted without its data. A ``KeyError`` (what a freed sample raises),
    so callers that only know that contract still treat it as gone; the queue's
    rule for it is a dead letter with reason ``lost``, never a redelivery.
    """

    def __init__(self, sample_id: str, store_uri: str, cause: str) -> None:
        super().__init__(sample_id)
        self.sample_id = sample_id
        self.store_uri = store_uri
        self.cause = cause

    def __str__(self) -> str:
        return f"sample {self.sample_id!r} was lost from {self.store_uri}: {self.cause}"


@dataclasses.dataclass(frozen=True)
class StoreHandle:
    """Proof of one ``get``; hand it to ``FeatureStore.release`` when done.

    ``handle_id`` defaults to a fresh process-wide unique id, so a store may
    build ``StoreHandle(store, sample_id, ref)`` and let every ``get`` mint its own.
    """

    store: Any
    sample_id: str
    ref: SampleRef
    handle_id: int = dataclasses.field(default_factory=new_handle_id)


@dataclasses.dataclass(frozen=True)
class StoreHealth:
    """Residency counters of a store (ints and bools only; never I/O to compute).

    ``sample_capacity`` is the store's sample-count cap (``max_samples``; 0: none): a put that would
    make ``sample_count`` exceed it raises ``MemoryError``, so backpressure pauses producers at it.
    ``pool_bytes``: the memory the store keeps faulted in for reuse (its buffer pool, its file arena; samples in
    them included), each pool at most the store's ``max_bytes`` plus one sample; 0 for a store without one.
    """

    resident_bytes: int
    capacity_bytes: int
    sample_count: int
    high_watermark_hit: bool
    low_watermark_hit: bool
    sample_capacity: int = 0
    pool_bytes: int = 0


class FeatureStore(abc.ABC):
    """Holds the tensors of samples; the queue only ever moves ``SampleRef``s.

    Residency contract: a sample no queue holds is freed when its last handle
    is released. A sample a queue holds (between ``retain`` and ``scrub``) is
    kept whatever handles are released, and ``scrub`` frees it whatever
    handles are still out. Stores written against the reference contract
    inherit no-op hooks and keep the reference behaviour.
    """

    store_uri: str

    @abc.abstractmethod
    def put(
        self,
        sample_id: str,
        tensors: Mapping[str, torch.Tensor],
        *,
        run_id: str = "default",
        algorithm: FeatureAlgorithm = FeatureAlgorithm.EAGLE3,
        schema_version: int = 1,
        target_model_version: str = "0",
        draft_weight_version: str = "0",
        num_tokens: int = 0,
        provenance: Mapping[str, str] | None = None,
        take_ownership: bool = False,
    ) -> SampleRef:
        """Store ``tensors`` under ``sample_id`` and return the ref describing them.

        ``provenance`` is the ref's (``SampleRef.provenance``: how the
        features are encoded); ``FeatureProducer`` passes it only when it has
        entries.

        ``take_ownership=True`` hands the tensors over: the caller promises
        never to touch them again, so the store may keep them instead of a
        copy. A store may ignore it (it is only an allowance); the built-in
        stores skip their defensive copy. ``FeatureProducer`` passes it only
        to stores whose ``put`` declares it, so a store written against the
        reference contract (without the keyword) keeps working.
        """

    @abc.abstractmethod
    def get(
        self, ref: SampleRef, device: torch.device | str | None = None
    ) -> tuple[dict[str, torch.Tensor], StoreHandle]:
        """Materialise ``ref``: one tensor per feature, in ``ref.feature_names()`` order."""

    @abc.abstractmethod
    def release(self, handle: StoreHandle) -> None:
        """Drop ``handle`` (idempotent); frees an unretained sample on its last handle."""

    @abc.abstractmethod
    def gc(self) -> int:
        """Sweep dead bookkeeping; return how many entries were swept."""

    @abc.abstractmethod
    def health(self) -> StoreHealth:
        """Residency snapshot from counters (no tensor or disk I/O)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Free everything (idempotent); later puts and gets raise ``RuntimeError``."""

    def retain(self, ref: SampleRef) -> None:  # noqa: B027 - optional hook, no-op by design
        """A queue now holds ``ref``: keep its bytes whatever handles are released.

        A ``ref`` of a put the store no longer holds (scrubbed or lost; a later put of the id may be resident)
        touches nothing and raises nothing: the later put stays as it is.
        """

    def unretain(self, ref: SampleRef) -> None:  # noqa: B027 - optional hook, no-op by design
        """Undo a ``retain`` whose put was refused: ``ref`` is back to plain handle-counted residency."""

    def scrub(self, ref: SampleRef) -> None:  # noqa: B027 - optional hook, no-op by design
        """The queue is done with ``ref`` (acked or dead): free it whatever handles are out.

        A ``ref`` of a put the store no longer holds touches nothing and raises nothing: a later put of the id,
        resident or not, stays as it is.
        """

    def reclaim_orphans(
        self, held: Callable[[Sequence[str]], set[str]] | None = None, *, force: bool = False, drained: bool = False
    ) -> int:
        """Free bytes whose writer died before any queue took them; return how many samples were freed.

        ``held(sample_ids)`` is a queue's answer to which of those ids it holds (pending, leased or as a dead
        letter): a store asks it before freeing a sample that carries a queued marker. ``force``: sweep now,
        whatever the store's own interval. ``drained``: ``held`` answers for a queue that is closed and drained,
        so no enqueue can land any more: the samples of every writer no longer alive (dead, or closed) go now,
        without the grace period. Stores whose bytes die with their writer (in-process ones) have nothing to
        reclaim: the default frees nothing.
        """
        return 0

    def is_resident(self, sample_id: str) -> bool:
        """Whether ``sample_id``'s bytes are held; stores that can tell override this."""
        raise NotImplementedError(f"{type(self).__name__} does not report per-sample residency")


# ``put``'s ref metadata keywords and their defaults, read off the contract's signature (the one place they are
# written), for stores that take them as ``**fields``.
REF_FIELD_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        name: parameter.default
        for name, parameter in inspect.signature(FeatureStore.put).parameters.items()
        if parameter.kind is parameter.KEYWORD_ONLY and name != "take_ownership"
    }
)
