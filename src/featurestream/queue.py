"""Reference-compatible import path: this module is ``featurestream.core.queue`` (the same module object)."""

import sys

from featurestream.core import queue as _module

sys.modules[__name__] = _module
