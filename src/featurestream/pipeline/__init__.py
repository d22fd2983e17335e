"""The feature pipeline: algorithm schemas (EAGLE-3, DFlash, DSpark, EAGLE-1/2 and registered user algorithms),
the producer, the loader and the async producer thread.

The names below are exported lazily (a name's module is imported on first access), so importing one pipeline
module does not import the others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from featurestream.common.exports import lazy_exports

_EXPORTS: dict[str, str] = {
    "AlgorithmSchema": "featurestream.pipeline.schemas",
    "schema_for": "featurestream.pipeline.schemas",
    "Eagle3TargetBackend": "featurestream.pipeline.eagle3",
    "Eagle3TargetBatch": "featurestream.pipeline.eagle3",
    "DFlashTargetBackend": "featurestream.pipeline.dflash",
    "DFlashTargetBatch": "featurestream.pipeline.dflash",
    "DSparkTargetBackend": "featurestream.pipeline.dspark",
    "DSparkTargetBatch": "featurestream.pipeline.dspark",
    "EagleTargetBackend": "featurestream.pipeline.eagle12",
    "EagleTargetBatch": "featurestream.pipeline.eagle12",
    "FeatureBatch": "featurestream.pipeline.features",
    "FeatureRule": "featurestream.pipeline.features",
    "FeatureSet": "featurestream.pipeline.features",
    "register_algorithm": "featurestream.pipeline.features",
    "FeatureDataLoader": "featurestream.pipeline.loader",
    "FeatureProducer": "featurestream.pipeline.producer",
}

__all__ = [
    "AlgorithmSchema",
    "DFlashTargetBackend",
    "DFlashTargetBatch",
    "DSparkTargetBackend",
    "DSparkTargetBatch",
    "Eagle3TargetBackend",
    "Eagle3TargetBatch",
    "EagleTargetBackend",
    "EagleTargetBatch",
    "FeatureBatch",
    "FeatureDataLoader",
    "FeatureProducer",
    "FeatureRule",
    "FeatureSet",
    "register_algorithm",
    "schema_for",
]

if TYPE_CHECKING:
    from featurestream.pipeline.dflash import DFlashTargetBackend, DFlashTargetBatch
    from featurestream.pipeline.dspark import DSparkTargetBackend, DSparkTargetBatch
    from featurestream.pipeline.eagle3 import Eagle3TargetBackend, Eagle3TargetBatch
    from featurestream.pipeline.eagle12 import EagleTargetBackend, EagleTargetBatch
    from featurestream.pipeline.features import FeatureBatch, FeatureRule, FeatureSet, register_algorithm
    from featurestream.pipeline.loader import FeatureDataLoader
    from featurestream.pipeline.producer import FeatureProducer
    from featurestream.pipeline.schemas import AlgorithmSchema, schema_for


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
