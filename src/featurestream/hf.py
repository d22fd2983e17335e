"""``featurestream.hf``: this module is ``featurestream.pipeline.hf`` (the same module object; needs ``[hf]``)."""

import sys

from featurestream.pipeline import hf as _module

sys.modules[__name__] = _module
