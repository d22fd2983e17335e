"""The built-in feature stores."""

from featurestream.stores.local import LocalFeatureStore

__all__ = ["LocalFeatureStore"]
