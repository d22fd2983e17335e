"""``featurestream.testing`` against store classes that are not part of the project (a user's own)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from featurestream import FeatureStore, SampleRef, StoreHandle, StoreHealth
from featurestream.common.refs import FeatureSpec
from featurestream.testing import InvariantViolation, make_queue_machine


class DictStore(FeatureStore):
    """A user's store written only against the reference contract: no retain/scrub, no is_resident.

    Each put is its own incarnation (``<id>@<n>`` in its feature keys), so a ref or a handle of an earlier put
    of an id never reaches a later one.
    """

    def __init__(self) -> None:
        self.store_uri = f"dict://{id(self)}"
        self._lock = threading.Lock()
        self._data: dict[str, dict[str, torch.Tensor]] = {}  # incarnation key -> tensors
        self._live: dict[str, str] = {}  # sample id -> its incarnation key, while resident
        self._handles: dict[int, str] = {}  # handle id -> incarnation key
        self._ids = itertools.count()
        self._puts = itertools.count()
        self._closed = False

    @staticmethod
    def _key(ref: SampleRef) -> str:
        return next(iter(ref.feature_keys.values())).rsplit("/", 1)[0]

    def put(self, sample_id: str, tensors: Mapping[str, torch.Tensor], **meta: object) -> SampleRef:
        specs = {name: FeatureSpec(tuple(t.shape), t.dtype) for name, t in tensors.items()}
        key = f"{sample_id}@{next(self._puts)}"
        ref = SampleRef(
            sample_id=sample_id,
            run_id=str(meta.get("run_id", "default")),
            store_uri=self.store_uri,
            feature_keys={name: f"{key}/{name}" for name in tensors},
            feature_specs=specs,
            algorithm=meta.get("algorithm", "eagle3"),  # type: ignore[arg-type]
            schema_version=1,
            num_tokens=0,
            estimated_bytes=sum(spec.nbytes for spec in specs.values()),
            target_model_version="0",
            draft_weight_version="0",
        )
        with self._lock:
            if sample_id in self._live:
                raise ValueError(f"duplicate sample {sample_id!r}")
            self._live[sample_id] = key
            self._data[key] = {name: t.clone() for name, t in tensors.items()}
        return ref

    def get(self, ref: SampleRef, device: object = None) -> tuple[dict[str, torch.Tensor], StoreHandle]:
        key = self._key(ref)
        with self._lock:
            if key not in self._data:
                raise KeyError(ref.sample_id)
            handle = StoreHandle(self, ref.sample_id, ref, next(self._ids))
            self._handles[handle.handle_id] = key
            return {name: t.clone() for name, t in self._data[key].items()}, handle

    def _free(self, key: str) -> None:
        """Drop one incarnation (lock held)."""
        self._data.pop(key, None)
        sample_id = key.rsplit("@", 1)[0]
        if self._live.get(sample_id) == key:
            del self._live[sample_id]

    def release(self, handle: StoreHandle) -> None:
        with self._lock:
            key = self._handles.pop(handle.handle_id, None)
            if key is not None and key not in self._handles.values():
                self._free(key)

    def gc(self) -> int:
        return 0

    def health(self) -> StoreHealth:
        with self._lock:
            resident = sum(sum(t.nbytes for t in d.values()) for d in self._data.values())
            return StoreHealth(resident, 0, len(self._data), False, resident == 0)

    def close(self) -> None:
        with self._lock:
            self._data.clear()
            self._live.clear()
            self._closed = True


class RetainingDictStore(DictStore):
    """The same user store, upgraded to the queue hooks: retained samples survive releases, scrub frees."""

    def __init__(self) -> None:
        super().__init__()
        self._retained: set[str] = set()

    def retain(self, ref: SampleRef) -> None:
        with self._lock:
            if self._key(ref) in self._data:
                self._retained.add(self._key(ref))

    def scrub(self, ref: SampleRef) -> None:
        with self._lock:
            self._retained.discard(self._key(ref))
            self._free(self._key(ref))

    def release(self, handle: StoreHandle) -> None:
        with self._lock:
            key = self._handles.pop(handle.handle_id, None)
            if key is None or key in self._retained or key in self._handles.values():
                return
            self._free(key)


TestRetainingUserStore = make_queue_machine(RetainingDictStore, name="RetainingUserStoreMachine").TestCase


def _violation(store: type[FeatureStore], name: str) -> InvariantViolation:
    """The violation the kit reports for ``store`` within 200 examples (it must find one)."""
    budget = settings(
        max_examples=200,
        database=None,
        report_multiple_bugs=False,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    with pytest.raises(InvariantViolation) as caught:
        run_state_machine_as_test(make_queue_machine(store, name=name), settings=budget)
    return caught.value


def test_reference_contract_store_is_caught_losing_a_queued_sample() -> None:
    """A store without retain frees a leased sample on the consumer's release: reference defect A."""
    assert _violation(DictStore, "ReferenceUserStoreMachine").invariant == "inv04_no_loss"


class StrictRetainDictStore(RetainingDictStore):
    """The upgraded store with a strict ``retain``: a ref whose put is gone is a ``KeyError``, against the
    contract (a stale incarnation's retain touches nothing and raises nothing)."""

    def retain(self, ref: SampleRef) -> None:
        with self._lock:
            if self._key(ref) not in self._data:
                raise KeyError(f"no such put: {self._key(ref)}")
        super().retain(ref)


def test_a_store_raising_on_a_stale_retain_is_reported_by_the_rule_it_breaks() -> None:
    """Not a raw traceback from inside the kit: the incarnation rule, naming the store method and the contract."""
    violation = _violation(StrictRetainDictStore, "StrictRetainUserStoreMachine")
    assert violation.invariant == "inv16_incarnations_never_cross"
    message = str(violation)
    assert "store.retain() of the earlier put of 's" in message, message
    assert "raised KeyError('no such put: s" in message and "must touch nothing and raise nothing" in message
