"""featurestream: stream training features through a lease/ack/fail queue and a feature store.

Every public name is exported lazily: ``import featurestream`` loads nothing
heavy, and a name's module (torch included) is imported on first access, so
torch-free tools such as ``featurestream --help`` stay fast.

Layout: ``common`` (refs, argument checks, errors: what both planes need),
``core`` (control plane: the coordinator, leases, machines), ``stores`` (data
plane), ``backends`` (the queue engines: ``memory``, ``redis``), ``pipeline``
(algorithm schemas, producer, loader), ``spec`` and ``testing``
(verification), ``monitor`` (trainer-side status and metrics), ``ops``
(the operator commands), ``tools`` (demo, tiny models, diagrams). The reference's module
paths (``featurestream.refs``, ``.store``, ``.queue``, ``.eagle3``,
``.producer``, ``.loader``, ``.async_pipeline``) are aliases of their new
homes, as are the paths modules had before a move.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from featurestream.common.exports import lazy_exports

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "FeatureStreamError": "featurestream.common.errors",
    "AsyncFeaturePipeline": "featurestream.pipeline.async_pipeline",
    "PromptSource": "featurestream.pipeline.async_pipeline",
    "Eagle3TargetBatch": "featurestream.pipeline.eagle3",
    "Eagle3TargetBackend": "featurestream.pipeline.eagle3",
    "DFlashTargetBatch": "featurestream.pipeline.dflash",
    "DFlashTargetBackend": "featurestream.pipeline.dflash",
    "DSparkTargetBatch": "featurestream.pipeline.dspark",
    "DSparkTargetBackend": "featurestream.pipeline.dspark",
    "EagleTargetBatch": "featurestream.pipeline.eagle12",
    "EagleTargetBackend": "featurestream.pipeline.eagle12",
    "FeatureRule": "featurestream.pipeline.features",
    "register_algorithm": "featurestream.pipeline.features",
    "FeatureDataLoader": "featurestream.pipeline.loader",
    "LoaderCloseTimeout": "featurestream.pipeline.loader",
    "FeatureProducer": "featurestream.pipeline.producer",
    "TargetBackend": "featurestream.pipeline.producer",
    "TargetHead": "featurestream.pipeline.target_head",
    "DeadLetter": "featurestream.core.lease",
    "Lease": "featurestream.core.lease",
    "VisibilityTimeout": "featurestream.core.lease",
    "QueueStats": "featurestream.backends.memory.queue",
    "DeadLetterNotKept": "featurestream.common.errors",
    "DeadLetterQueued": "featurestream.common.errors",
    "DuplicateSample": "featurestream.common.errors",
    "IllegalTransition": "featurestream.common.errors",
    "KeptDeadLetter": "featurestream.common.errors",
    "LeaseLost": "featurestream.common.errors",
    "NotALease": "featurestream.common.errors",
    "NotDeadLetter": "featurestream.common.errors",
    "NotResident": "featurestream.common.errors",
    "ProducerFailed": "featurestream.common.errors",
    "QueueInUse": "featurestream.common.errors",
    "PutAborted": "featurestream.common.errors",
    "QueueClosed": "featurestream.common.errors",
    "QueueDrained": "featurestream.common.errors",
    "RepeatedInBatch": "featurestream.common.errors",
    "ScrubOwed": "featurestream.common.errors",
    "SettledSample": "featurestream.common.errors",
    "StoreMismatch": "featurestream.common.errors",
    "TensorInRef": "featurestream.common.errors",
    "StaleTrainer": "featurestream.core.resume",
    "SampleRefQueue": "featurestream.backends.memory.queue",
    "LeaseQueue": "featurestream.core.protocol",
    "FeatureAlgorithm": "featurestream.common.refs",
    "FeatureSpec": "featurestream.common.refs",
    "SampleRef": "featurestream.common.refs",
    "assert_no_tensors": "featurestream.common.refs",
    "FeatureStore": "featurestream.stores.base",
    "StoreHandle": "featurestream.stores.base",
    "StoreHealth": "featurestream.stores.base",
    "SampleLostError": "featurestream.stores.base",
    "LocalFeatureStore": "featurestream.stores.local",
    "CorruptSampleError": "featurestream.stores.shared_dir",
    "SharedDirFeatureStore": "featurestream.stores.shared_dir",
    "render_queue": "featurestream.tools.diagrams",
    "GraphvizMissing": "featurestream.tools.diagrams",
    "ToolMissing": "featurestream.spec.tlc",
    "TargetError": "featurestream.ops.target",
}
# redis-py and Mooncake are optional: RedisSampleRefQueue, MooncakeFeatureStore and the Redis connection errors
# load on first use and stay out of __all__, so ``from featurestream import *`` needs neither.
_OPTIONAL: dict[str, str] = {
    "RedisSampleRefQueue": "featurestream.backends.redis.queue",
    "MooncakeFeatureStore": "featurestream.stores.mooncake",
    "RedisUnreachable": "featurestream.backends.redis.link",
    "NotRedisServer": "featurestream.backends.redis.link",
    "NotPrimary": "featurestream.backends.redis.link",
    "ReplicasMissing": "featurestream.backends.redis.link",
    "NotReplicated": "featurestream.backends.redis.link",
    "PrimaryLost": "featurestream.backends.redis.link",
    "TooFewReplicas": "featurestream.backends.redis.replicas",
    "SentinelAtUrl": "featurestream.backends.redis.link",
    "SentinelServiceError": "featurestream.backends.redis.sentinel",
}

__all__ = [
    "AsyncFeaturePipeline",
    "CorruptSampleError",
    "DFlashTargetBackend",
    "DFlashTargetBatch",
    "DSparkTargetBackend",
    "DSparkTargetBatch",
    "DeadLetter",
    "DeadLetterNotKept",
    "DeadLetterQueued",
    "DuplicateSample",
    "Eagle3TargetBackend",
    "Eagle3TargetBatch",
    "EagleTargetBackend",
    "EagleTargetBatch",
    "FeatureAlgorithm",
    "FeatureDataLoader",
    "FeatureProducer",
    "FeatureRule",
    "FeatureSpec",
    "FeatureStore",
    "FeatureStreamError",
    "GraphvizMissing",
    "IllegalTransition",
    "KeptDeadLetter",
    "Lease",
    "LeaseLost",
    "LeaseQueue",
    "LoaderCloseTimeout",
    "LocalFeatureStore",
    "NotALease",
    "NotDeadLetter",
    "NotResident",
    "PromptSource",
    "ProducerFailed",
    "QueueInUse",
    "PutAborted",
    "QueueClosed",
    "QueueDrained",
    "QueueStats",
    "RepeatedInBatch",
    "SampleLostError",
    "SampleRef",
    "SampleRefQueue",
    "ScrubOwed",
    "SettledSample",
    "SharedDirFeatureStore",
    "StaleTrainer",
    "StoreHandle",
    "StoreHealth",
    "StoreMismatch",
    "TargetBackend",
    "TargetError",
    "TargetHead",
    "TensorInRef",
    "ToolMissing",
    "VisibilityTimeout",
    "assert_no_tensors",
    "register_algorithm",
    "render_queue",
]

if TYPE_CHECKING:
    from featurestream.backends.memory.queue import QueueStats, SampleRefQueue
    from featurestream.backends.redis.link import NotPrimary as NotPrimary
    from featurestream.backends.redis.link import NotRedisServer as NotRedisServer
    from featurestream.backends.redis.link import NotReplicated as NotReplicated
    from featurestream.backends.redis.link import PrimaryLost as PrimaryLost
    from featurestream.backends.redis.link import RedisUnreachable as RedisUnreachable
    from featurestream.backends.redis.link import ReplicasMissing as ReplicasMissing
    from featurestream.backends.redis.link import SentinelAtUrl as SentinelAtUrl
    from featurestream.backends.redis.queue import RedisSampleRefQueue as RedisSampleRefQueue
    from featurestream.backends.redis.replicas import TooFewReplicas as TooFewReplicas
    from featurestream.backends.redis.sentinel import SentinelServiceError as SentinelServiceError
    from featurestream.common.errors import (
        DeadLetterNotKept,
        DeadLetterQueued,
        DuplicateSample,
        FeatureStreamError,
        IllegalTransition,
        KeptDeadLetter,
        LeaseLost,
        NotALease,
        NotDeadLetter,
        NotResident,
        ProducerFailed,
        PutAborted,
        QueueClosed,
        QueueDrained,
        QueueInUse,
        RepeatedInBatch,
        ScrubOwed,
        SettledSample,
        StoreMismatch,
        TensorInRef,
    )
    from featurestream.common.refs import FeatureAlgorithm, FeatureSpec, SampleRef, assert_no_tensors
    from featurestream.core.lease import DeadLetter, Lease, VisibilityTimeout
    from featurestream.core.protocol import LeaseQueue
    from featurestream.core.resume import StaleTrainer
    from featurestream.ops.target import TargetError
    from featurestream.pipeline.async_pipeline import AsyncFeaturePipeline, PromptSource
    from featurestream.pipeline.dflash import DFlashTargetBackend, DFlashTargetBatch
    from featurestream.pipeline.dspark import DSparkTargetBackend, DSparkTargetBatch
    from featurestream.pipeline.eagle3 import Eagle3TargetBackend, Eagle3TargetBatch
    from featurestream.pipeline.eagle12 import EagleTargetBackend, EagleTargetBatch
    from featurestream.pipeline.features import FeatureRule, register_algorithm
    from featurestream.pipeline.loader import FeatureDataLoader, LoaderCloseTimeout
    from featurestream.pipeline.producer import FeatureProducer, TargetBackend
    from featurestream.pipeline.target_head import TargetHead
    from featurestream.spec.tlc import ToolMissing
    from featurestream.stores.base import FeatureStore, SampleLostError, StoreHandle, StoreHealth
    from featurestream.stores.local import LocalFeatureStore
    from featurestream.stores.mooncake import MooncakeFeatureStore as MooncakeFeatureStore
    from featurestream.stores.shared_dir import CorruptSampleError, SharedDirFeatureStore
    from featurestream.tools.diagrams import GraphvizMissing, render_queue


__getattr__, __dir__ = lazy_exports(__name__, globals(), {**_OPTIONAL, **_EXPORTS})
