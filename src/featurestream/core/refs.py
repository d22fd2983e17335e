"""Former import path: this module is ``featurestream.common.refs`` (the same module object)."""

import sys

from featurestream.common import refs as _module

sys.modules[__name__] = _module
