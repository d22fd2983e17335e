"""Former import path: this module is ``featurestream.monitor.metrics`` (the same module object)."""

import sys

from featurestream.monitor import metrics as _module

sys.modules[__name__] = _module
