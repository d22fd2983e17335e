"""Former import path: this package is ``featurestream.ops`` (the same module object), and so are its modules.

Each module is aliased here too: once this name is ``featurestream.ops``, Python would otherwise load
``featurestream.tools.ops.status`` from ``featurestream.ops``'s folder as a second, separate module.
"""

import sys

from featurestream import ops as _package
from featurestream.ops import dead_letters, status, target

sys.modules[__name__] = _package
for _module in (dead_letters, status, target):
    sys.modules[_module.__name__.replace("featurestream.ops", __name__, 1)] = _module
