"""Every error featurestream raises on purpose is a ``FeatureStreamError``, keeps the builtin recipes catch, and is
exported from the package root."""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
import re

import pytest
import redis

import featurestream
from featurestream import LocalFeatureStore, SampleRefQueue, VisibilityTimeout
from featurestream.common import errors
from featurestream.testing import sample_tensors

# The library's packages. The test kit (``testing``) is left out: its errors imitate a foreign failure
# (``InjectedFault`` is a store's ``OSError``) or report a defect (``InvariantViolation``), which no
# ``except FeatureStreamError`` may catch.
LIBRARY = ("common", "core", "stores", "backends", "pipeline", "monitor", "spec", "tools", "ops")

# Each error type and the builtin (or redis-py) class a caller written against the reference or the docs catches.
CAUGHT_AS: dict[str, type[BaseException]] = {
    "QueueClosed": RuntimeError,
    "ProducerFailed": RuntimeError,
    "QueueInUse": RuntimeError,
    "PutAborted": RuntimeError,
    "LeaseLost": RuntimeError,
    "DuplicateSample": ValueError,
    "RepeatedInBatch": ValueError,
    "SettledSample": ValueError,
    "ScrubOwed": ValueError,
    "KeptDeadLetter": ValueError,
    "NotResident": ValueError,
    "StoreMismatch": ValueError,
    "DeadLetterNotKept": ValueError,
    "DeadLetterQueued": ValueError,
    "QueueDrained": ValueError,
    "NotDeadLetter": LookupError,
    "NotALease": TypeError,
    "TensorInRef": TypeError,
    "IllegalTransition": AssertionError,
    "SampleLostError": KeyError,
    "CorruptSampleError": RuntimeError,
    "StaleTrainer": RuntimeError,
    "LoaderCloseTimeout": TimeoutError,
    "RedisUnreachable": redis.ConnectionError,
    "NotRedisServer": redis.ConnectionError,
    "NotPrimary": redis.ReadOnlyError,
    "ReplicasMissing": ValueError,
    "NotReplicated": redis.ConnectionError,
    "PrimaryLost": redis.ConnectionError,
    "TooFewReplicas": redis.ConnectionError,
    "SentinelAtUrl": ValueError,
    "SentinelServiceError": redis.ConnectionError,
    "ToolMissing": RuntimeError,
    "GraphvizMissing": RuntimeError,
    "TargetError": Exception,
}


def library_errors() -> dict[str, type[BaseException]]:
    """Every exception class a library module defines, by name (a name defined twice would fail here)."""
    found: dict[str, type[BaseException]] = {}
    for package in LIBRARY:
        module = importlib.import_module(f"featurestream.{package}")
        for info in pkgutil.walk_packages(module.__path__, f"{module.__name__}."):
            try:
                loaded = importlib.import_module(info.name)
            except ImportError:  # an optional dependency (Mooncake) this machine lacks
                continue
            for name, value in vars(loaded).items():
                if (
                    inspect.isclass(value)
                    and issubclass(value, BaseException)
                    and value.__module__ == info.name
                    and not name.startswith("_")
                ):
                    assert found.setdefault(name, value) is value, f"two error types named {name}"
    return found


def test_every_library_error_is_known_here_exported_from_the_root_and_caught_as_its_builtin() -> None:
    found = library_errors()
    assert set(found) == set(CAUGHT_AS) | {"FeatureStreamError"}
    for name, error in found.items():
        assert getattr(featurestream, name) is error, name
        assert name in featurestream.__all__ or name in featurestream._OPTIONAL, name
        if name != "FeatureStreamError":
            assert issubclass(error, CAUGHT_AS[name]), name


def test_every_error_but_a_defect_report_is_a_feature_stream_error() -> None:
    found = library_errors()
    ours = {name for name, error in found.items() if issubclass(error, featurestream.FeatureStreamError)}
    # IllegalTransition reports a defect of the queue: an ``except FeatureStreamError`` must never hide it.
    assert set(found) - ours == {"IllegalTransition"}
    assert featurestream.FeatureStreamError is errors.FeatureStreamError


def test_a_refused_call_is_caught_as_feature_stream_error_and_still_as_its_builtin() -> None:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store, VisibilityTimeout(30.0))
    ref = store.put("s0", sample_tensors(0))
    queue.put(ref)
    with pytest.raises(featurestream.FeatureStreamError) as caught:
        queue.put(ref)
    assert isinstance(caught.value, ValueError) and type(caught.value) is featurestream.DuplicateSample
    lease = queue.acquire(timeout=0)
    assert lease is not None and queue.ack(lease)
    with pytest.raises(RuntimeError) as lost:
        queue.extend(lease)
    assert isinstance(lost.value, featurestream.FeatureStreamError) and type(lost.value) is featurestream.LeaseLost
    queue.close()
    with pytest.raises(featurestream.QueueClosed, match="'s1'"):
        queue.put(store.put("s1", sample_tensors(1)))


def test_errors_still_pickle_as_raised() -> None:
    error = featurestream.SettledSample("s0", "acked")
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is featurestream.SettledSample and back.args == error.args and back.outcome == "acked"
    assert isinstance(back, featurestream.FeatureStreamError)


@pytest.mark.parametrize(
    ("why", "detail", "expected", "says"),
    [
        ("closed", "", featurestream.QueueClosed, "the queue is closed"),
        ("held", "leased", featurestream.DuplicateSample, r"already queued \(leased\)"),
        ("held", "", featurestream.DuplicateSample, "it is already queued; ids"),
        ("kept", "", featurestream.KeptDeadLetter, "dead letter whose bytes are kept"),
        ("settled", "acked", featurestream.SettledSample, "was already acked"),
    ],
)
def test_put_refused_maps_each_refusal_to_its_error(why: str, detail: str, expected: type, says: str) -> None:
    error = errors.put_refused(why, "s7", detail)
    assert type(error) is expected and error.sample_id == "s7"
    assert re.search(says, str(error)) and "'s7'" in str(error)
