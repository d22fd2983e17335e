"""No module of the package is over 600 lines but the spec mirror, whose docstring says why."""

from __future__ import annotations

from pathlib import Path

import featurestream

PACKAGE = Path(featurestream.__file__).parent
LIMIT = 600
EXEMPT = {"spec/mirror.py"}  # follows spec/LeaseQueue.tla action by action (its docstring)


def test_no_module_is_over_the_limit() -> None:
    sizes = {
        path.relative_to(PACKAGE).as_posix(): len(path.read_text().splitlines())
        for path in [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.lua")]
    }
    assert sizes["spec/mirror.py"] > LIMIT  # the exemption is still needed, and the walk found the package
    over = {name: n for name, n in sizes.items() if n > LIMIT and name not in EXEMPT}
    assert not over, f"split these by responsibility: {over}"
