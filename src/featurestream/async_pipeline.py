"""Reference-compatible import path: this module is ``featurestream.pipeline.async_pipeline`` (same object)."""

import sys

from featurestream.pipeline import async_pipeline as _module

sys.modules[__name__] = _module
