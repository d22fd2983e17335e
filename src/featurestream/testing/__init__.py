"""Stateful tests of a lease queue and its feature store against the spec, for your own CI.

``make_queue_machine(store_factory, queue_factory)`` returns a Hypothesis
``RuleBasedStateMachine`` whose rules are the actions of ``spec/LeaseQueue.tla``;
each step is applied to your queue/store and to the spec's Python mirror, and
the named invariants ``inv01_...`` to ``inv17_...`` are checked at the end of every rule::

    from featurestream.testing import make_queue_machine
    TestMyStore = make_queue_machine(lambda: MyStore(max_samples=16)).TestCase

Importing this package changes no Hypothesis setting; ``load_profile()``
(``featurestream.testing.profiles``) loads the kit's ``ci`` or ``deep`` budget.
The kit needs Hypothesis: ``pip install 'featurestream[testing]'``.

See ``docs/testing.md``.
"""

try:
    import hypothesis  # noqa: F401  (the kit's machines are Hypothesis state machines)
except ImportError as missing:
    raise ImportError(
        "featurestream.testing needs Hypothesis: pip install 'featurestream[testing]' "
        "(or pip install 'hypothesis>=6.100')"
    ) from missing

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
from featurestream.testing.profiles import PROFILES, load_profile
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
    "load_profile",
    "make_queue_machine",
    "record_machine_traces",
    "sample_tensors",
]
