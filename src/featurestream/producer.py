"""Reference-compatible import path: this module is ``featurestream.pipeline.producer`` (the same module object)."""

import sys

from featurestream.pipeline import producer as _module

sys.modules[__name__] = _module
