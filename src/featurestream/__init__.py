"""featurestream: stream training features through a lease/ack/fail queue and a feature store."""

from featurestream.async_pipeline import AsyncFeaturePipeline
from featurestream.eagle3 import Eagle3TargetBatch
from featurestream.lease import DeadLetter, Lease, VisibilityTimeout
from featurestream.loader import FeatureDataLoader
from featurestream.producer import FeatureProducer, TargetBackend
from featurestream.queue import LeaseLost, QueueStats, SampleRefQueue
from featurestream.refs import FeatureAlgorithm, FeatureSpec, SampleRef, assert_no_tensors
from featurestream.store import FeatureStore, StoreHandle, StoreHealth
from featurestream.stores.local import LocalFeatureStore
from featurestream.stores.shared_dir import CorruptSampleError, SharedDirFeatureStore

__version__ = "0.1.0"

__all__ = [
    "AsyncFeaturePipeline",
    "CorruptSampleError",
    "Eagle3TargetBatch",
    "FeatureDataLoader",
    "FeatureProducer",
    "SharedDirFeatureStore",
    "TargetBackend",
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
