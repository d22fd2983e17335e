"""Reference-compatible import path: this module is ``featurestream.backends.memory.queue`` (the same module object)."""

import sys

from featurestream.backends.memory import queue as _module

sys.modules[__name__] = _module
