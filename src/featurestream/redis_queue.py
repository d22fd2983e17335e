"""Reference-compatible import path: this module is ``featurestream.backends.redis.queue`` (the same module object)."""

import sys

from featurestream.backends.redis import queue as _module

sys.modules[__name__] = _module
