"""Reference-compatible import path: this module is ``featurestream.core.refs`` (the same module object)."""

import sys

from featurestream.core import refs as _module

sys.modules[__name__] = _module
