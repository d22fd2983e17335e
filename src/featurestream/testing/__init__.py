"""Stateful tests of a lease queue and its feature store against the spec, for your own CI.

``make_queue_machine(store_factory, queue_factory)`` returns a Hypothesis
``RuleBasedStateMachine`` whose rules are the actions of ``spec/LeaseQueue.tla``;
each step is applied to your queue/store and to the spec's Python mirror, and
the named invariants ``inv01_...`` to ``inv16_...`` are checked at the end of every rule::

    from featurestream.testing import make_queue_machine
    TestMyStore = make_queue_machine(lambda: MyStore(max_samples=16)).TestCase

Importing this package registers the Hypothesis profiles ``ci`` and ``deep``
(``featurestream.testing.profiles``) and loads the one ``HYPOTHESIS_PROFILE`` names.

See ``docs/testing.md``.
"""

from featurestream.testing.clock import FakeClock
from featurestream.testing.faults import (
    EXACT_CALLS,
    FAILOVER_MOMENTS,
    UNTIL_CLEARED,
    FailsOver,
    FaultyStore,
    InjectedFault,
    LosesReplies,
)
from featurestream.testing.machine import InvariantViolation, MachineConfig, QueueMachine
from featurestream.testing.producers import BlockedPut
from featurestream.testing.profiles import PROFILES, register_profiles
from featurestream.testing.rules import checked, make_queue_machine
from featurestream.testing.samples import sample_tensors
from featurestream.testing.traces import (
    backpressure_trace,
    describe_rejections,
    duplicate_delivery_trace,
    record_machine_traces,
)

__all__ = [
    "EXACT_CALLS",
    "FAILOVER_MOMENTS",
    "UNTIL_CLEARED",
    "BlockedPut",
    "FailsOver",
    "FakeClock",
    "FaultyStore",
    "InjectedFault",
    "LosesReplies",
    "PROFILES",
    "InvariantViolation",
    "MachineConfig",
    "QueueMachine",
    "backpressure_trace",
    "checked",
    "describe_rejections",
    "duplicate_delivery_trace",
    "make_queue_machine",
    "record_machine_traces",
    "register_profiles",
    "sample_tensors",
]

register_profiles()
