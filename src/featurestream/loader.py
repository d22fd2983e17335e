"""Reference-compatible import path: this module is ``featurestream.pipeline.loader`` (the same module object)."""

import sys

from featurestream.pipeline import loader as _module

sys.modules[__name__] = _module
