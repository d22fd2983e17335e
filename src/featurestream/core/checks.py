"""Former import path: this module is ``featurestream.common.checks`` (the same module object)."""

import sys

from featurestream.common import checks as _module

sys.modules[__name__] = _module
