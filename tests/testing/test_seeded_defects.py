"""Each known defect (reference A-E, P, S, L, I, G, U), re-introduced in the implementation, is caught by name.

The budget is the CI profile's (200 examples of 40 steps, derandomized); shrinking is skipped
because only the verdict and the invariant's name are asserted here. The
control (the same machine finding nothing in the real queue and store) is
``test_machine_local.test_local_store_machine``.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from featurestream import LocalFeatureStore, SampleRefQueue
from featurestream.testing import InvariantViolation, MachineConfig, make_queue_machine
from support.defects import (
    CountingGiveBackQueue,
    IncarnationBlindStore,
    LostRedeliveringQueue,
    NoDedupQueue,
    NoDeliveryLimitQueue,
    NoReaperQueue,
    OldBackpressureQueue,
    RejectAckingQueue,
    RetainIgnoringStore,
    UnretainingScrubStore,
    UnsettlingScrubQueue,
)

DEFECTS = {
    "A": (RetainIgnoringStore, SampleRefQueue, "inv04_no_loss"),
    "B": (UnretainingScrubStore, SampleRefQueue, "inv05_no_leak"),
    "C": (LocalFeatureStore, NoDedupQueue, "inv02_exactly_once"),
    "D": (LocalFeatureStore, NoDeliveryLimitQueue, "inv07_bounded_delivery"),
    "E": (LocalFeatureStore, NoReaperQueue, "inv10_expired_leases_reclaimed"),
    "G": (LocalFeatureStore, CountingGiveBackQueue, "inv11_counters_consistent"),
    "I": (IncarnationBlindStore, SampleRefQueue, "inv16_incarnations_never_cross"),
    "L": (LocalFeatureStore, LostRedeliveringQueue, "inv04_no_loss"),
    "P": (LocalFeatureStore, OldBackpressureQueue, "inv13_producer_progress"),
    "S": (LocalFeatureStore, UnsettlingScrubQueue, "inv14_store_faults_survivable"),
    "U": (LocalFeatureStore, RejectAckingQueue, "inv17_acked_only_if_trained"),
}

BUDGET = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    database=None,
    derandomize=True,  # the same examples every run: a verdict that cannot flake
    report_multiple_bugs=False,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


# The defects that show only where consumers hand leases back (G) or meet a sample their schema refuses (U).
CONFIGS = {"G": MachineConfig(give_backs=True), "U": MachineConfig(untrainable=1)}


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_state_machine_catches_seeded_defect(defect: str) -> None:
    store, queue, invariant = DEFECTS[defect]
    machine = make_queue_machine(store, queue, CONFIGS.get(defect), name=f"Defect{defect}Machine")
    with pytest.raises(InvariantViolation) as caught:
        run_state_machine_as_test(machine, settings=BUDGET)
    assert caught.value.invariant == invariant, str(caught.value)
