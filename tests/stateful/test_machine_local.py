"""The spec-action state machine against the built-in stores (budget: the loaded Hypothesis profile)."""

from __future__ import annotations

import importlib
import tempfile

import pytest

from featurestream import LocalFeatureStore
from featurestream.testing import MachineConfig, make_queue_machine

TestLocalStoreMachine = make_queue_machine(LocalFeatureStore, name="LocalStoreMachine").TestCase

# One delivery: every fail or reclaim dead-letters at once.
TestLocalStoreSingleDelivery = make_queue_machine(
    LocalFeatureStore, config=MachineConfig(max_deliveries=1, consumers=3), name="SingleDeliveryMachine"
).TestCase


def test_shared_dir_store_machine() -> None:
    try:
        shared_dir = importlib.import_module("featurestream.stores.shared_dir")
    except ModuleNotFoundError:
        pytest.skip("featurestream.stores.shared_dir is not there yet (SharedDirFeatureStore lands with its own issue)")
    root = tempfile.TemporaryDirectory(prefix="featurestream-machine-")

    def store() -> object:
        return shared_dir.SharedDirFeatureStore(tempfile.mkdtemp(dir=root.name))

    with root:
        make_queue_machine(store, name="SharedDirStoreMachine").TestCase("runTest").runTest()
