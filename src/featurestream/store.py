"""Reference-compatible import path: this module is ``featurestream.stores.base`` (the same module object)."""

import sys

from featurestream.stores import base as _module

sys.modules[__name__] = _module
