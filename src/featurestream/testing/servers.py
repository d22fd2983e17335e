"""Former import path: this module is ``featurestream.tools.servers`` (the same module object)."""

import sys

from featurestream.tools import servers as _module

sys.modules[__name__] = _module
