"""Former import path: this module is ``featurestream.monitor.status`` (the same module object)."""

import sys

from featurestream.monitor import status as _module

sys.modules[__name__] = _module
