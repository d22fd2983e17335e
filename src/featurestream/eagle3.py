"""Reference-compatible import path: this module is ``featurestream.pipeline.eagle3`` (the same module object)."""

import sys

from featurestream.pipeline import eagle3 as _module

sys.modules[__name__] = _module
