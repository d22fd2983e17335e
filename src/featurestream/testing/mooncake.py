"""Former import path: this module is ``featurestream.tools.mooncake`` (the same module object)."""

import sys

from featurestream.tools import mooncake as _module

sys.modules[__name__] = _module
