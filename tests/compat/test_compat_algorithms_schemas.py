"""DFlash, DSpark and EAGLE-1/2 batches against the reference's own classes: the same fields in the same order
with the same optional ones, and, once the reference's module is imported, the loader yields instances of the
reference's class (a subclass of both) that pickle."""

from __future__ import annotations

import dataclasses
import importlib
import pickle

import pytest
import torch

from featurestream import (
    DFlashTargetBatch,
    DSparkTargetBatch,
    EagleTargetBatch,
    FeatureAlgorithm,
    FeatureDataLoader,
    LocalFeatureStore,
    SampleRefQueue,
)
from support.algorithm_samples import packing, sample_of

from .conftest import PREFIX, Reference

CASES = {
    FeatureAlgorithm.DFLASH: (DFlashTargetBatch, "dflash.target", "DFlashTargetBatch"),
    FeatureAlgorithm.DSPARK: (DSparkTargetBatch, "dspark.target", "DSparkTargetBatch"),
    FeatureAlgorithm.EAGLE: (EagleTargetBatch, "eagle.target_v12", "EagleTargetBatch"),
}


def reference_class(algorithm: FeatureAlgorithm) -> type:
    _, module, name = CASES[algorithm]
    return getattr(importlib.import_module(f"{PREFIX}.{module}"), name)  # type: ignore[no-any-return]


def signature(batch_type: type) -> list[tuple[str, bool]]:
    """Each field's name and whether it is optional (defaults to ``None``), in order."""
    return [(field.name, field.default is None) for field in dataclasses.fields(batch_type)]


@pytest.mark.parametrize("algorithm", list(CASES))
def test_fields_order_and_optional_ones_are_the_references(reference: Reference, algorithm: FeatureAlgorithm) -> None:
    ours = CASES[algorithm][0]
    assert signature(ours) == signature(reference_class(algorithm))
    assert ours.FEATURES.optional == tuple(name for name, optional in signature(ours) if optional)


@pytest.mark.parametrize("algorithm", list(CASES))
def test_the_loader_yields_the_references_class_and_it_pickles(
    reference: Reference, algorithm: FeatureAlgorithm
) -> None:
    theirs = reference_class(algorithm)
    tensors = {**sample_of(algorithm, 3), **packing()}
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    queue.put(store.put("s", tensors, run_id="r", algorithm=algorithm))
    queue.close()
    with FeatureDataLoader(queue, store, algorithm=algorithm, prefetch=0) as loader:
        (batch,) = list(loader)
    assert isinstance(batch, theirs) and isinstance(batch, CASES[algorithm][0])
    # A recipe written for the reference reads its fields; featurestream's methods stay available.
    assert all(torch.equal(getattr(batch, name), tensor) for name, tensor in tensors.items())
    assert batch.to_trainer_inputs()
    copied = pickle.loads(pickle.dumps(batch))
    assert type(copied) is type(batch) and all(torch.equal(copied[name], t) for name, t in tensors.items())
    # The reference's own batch, as its wrapper returns it, is what our batch class is built from.
    assert signature(type(batch))[: len(signature(theirs))] == signature(theirs)
