"""The built-in feature stores."""

from featurestream.stores.local import LocalFeatureStore
from featurestream.stores.shared_dir import CorruptSampleError, SharedDirFeatureStore

__all__ = ["CorruptSampleError", "LocalFeatureStore", "SharedDirFeatureStore"]
