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
from featurestream.core.refs import FeatureSpec
from featurestream.testing import InvariantViolation, make_queue_machine


class DictStore(FeatureStore):
    """A user's store written only against the reference contract: no retain/scrub, no is_resident."""

    def __init__(self) -> None:
        self.store_uri = f"dict://{id(self)}"
        self._lock = threading.Lock()
        self._data: dict[str, dict[str, torch.Tensor]] = {}
        self._handles: dict[int, str] = {}
        self._ids = itertools.count()
        self._closed = False

    def put(self, sample_id: str, tensors: Mapping[str, torch.Tensor], **meta: object) -> SampleRef:
        specs = {name: FeatureSpec(tuple(t.shape), t.dtype) for name, t in tensors.items()}
        ref = SampleRef(
            sample_id=sample_id,
            run_id=str(meta.get("run_id", "default")),
            store_uri=self.store_uri,
            feature_keys={name: f"{sample_id}/{name}" for name in tensors},
            feature_specs=specs,
            algorithm=meta.get("algorithm", "eagle3"),  # type: ignore[arg-type]
            schema_version=1,
            num_tokens=0,
            estimated_bytes=sum(spec.nbytes for spec in specs.values()),
            target_model_version="0",
            draft_weight_version="0",
        )
        with self._lock:
            if sample_id in self._data:
                raise ValueError(f"duplicate sample {sample_id!r}")
            self._data[sample_id] = {name: t.clone() for name, t in tensors.items()}
        return ref

    def get(self, ref: SampleRef, device: object = None) -> tuple[dict[str, torch.Tensor], StoreHandle]:
        with self._lock:
            if ref.sample_id not in self._data:
                raise KeyError(ref.sample_id)
            handle = StoreHandle(self, ref.sample_id, ref, next(self._ids))
            self._handles[handle.handle_id] = ref.sample_id
            return {name: t.clone() for name, t in self._data[ref.sample_id].items()}, handle

    def release(self, handle: StoreHandle) -> None:
        with self._lock:
            sample_id = self._handles.pop(handle.handle_id, None)
            if sample_id is not None and sample_id not in self._handles.values():
                self._data.pop(sample_id, None)

    def gc(self) -> int:
        return 0

    def health(self) -> StoreHealth:
        with self._lock:
            resident = sum(sum(t.nbytes for t in d.values()) for d in self._data.values())
            return StoreHealth(resident, 0, len(self._data), False, resident == 0)

    def close(self) -> None:
        with self._lock:
            self._data.clear()
            self._closed = True


class RetainingDictStore(DictStore):
    """The same user store, upgraded to the queue hooks: retained samples survive releases, scrub frees."""

    def __init__(self) -> None:
        super().__init__()
        self._retained: set[str] = set()

    def retain(self, ref: SampleRef) -> None:
        with self._lock:
            self._retained.add(ref.sample_id)

    def scrub(self, ref: SampleRef) -> None:
        with self._lock:
            self._retained.discard(ref.sample_id)
            self._data.pop(ref.sample_id, None)

    def release(self, handle: StoreHandle) -> None:
        with self._lock:
            sample_id = self._handles.pop(handle.handle_id, None)
            if sample_id is None or sample_id in self._retained or sample_id in self._handles.values():
                return
            self._data.pop(sample_id, None)


TestRetainingUserStore = make_queue_machine(RetainingDictStore, name="RetainingUserStoreMachine").TestCase


def test_reference_contract_store_is_caught_losing_a_queued_sample() -> None:
    """A store without retain frees a leased sample on the consumer's release: reference defect A."""
    machine = make_queue_machine(DictStore, name="ReferenceUserStoreMachine")
    budget = settings(
        max_examples=200,
        database=None,
        report_multiple_bugs=False,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    with pytest.raises(InvariantViolation) as caught:
        run_state_machine_as_test(machine, settings=budget)
    assert caught.value.invariant == "inv04_no_loss"
