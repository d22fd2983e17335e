"""featurestream: stream training features through a lease/ack/fail queue and a feature store."""

from featurestream.lease import DeadLetter, Lease, VisibilityTimeout
from featurestream.queue import LeaseLost, QueueStats, SampleRefQueue
from featurestream.refs import FeatureAlgorithm, FeatureSpec, SampleRef, assert_no_tensors
from featurestream.store import FeatureStore, StoreHandle, StoreHealth
from featurestream.stores.local import LocalFeatureStore

__version__ = "0.1.0"

__all__ = [
    "DeadLetter",
    "FeatureAlgorithm",
    "FeatureSpec",
    "FeatureStore",
    "Lease",
    "LeaseLost",
    "LocalFeatureStore",
    "QueueStats",
    "SampleRef",
    "SampleRefQueue",
    "StoreHandle",
    "StoreHealth",
    "VisibilityTimeout",
    "assert_no_tensors",
]


def __getattr__(name: str) -> object:
    # redis-py is optional: RedisSampleRefQueue (kept out of __all__ so `import *` never needs it) loads on first use.
    if name == "RedisSampleRefQueue":
        from featurestream.redis_queue import RedisSampleRefQueue

        return RedisSampleRefQueue
    raise AttributeError(f"module 'featurestream' has no attribute {name!r}")
