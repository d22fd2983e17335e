"""Former import path: this module is ``featurestream.common.errors`` (the same module object)."""

import sys

from featurestream.common import errors as _module

sys.modules[__name__] = _module
