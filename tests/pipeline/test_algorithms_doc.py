"""docs/algorithms.md's registration example runs as written, in a fresh interpreter (the registry is global)."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "algorithms.md"


def test_the_registration_example_streams_a_users_algorithm() -> None:
    section = DOC.read_text().split("## Registering a new algorithm", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == "MedusaBatch torch.Size([2, 5, 8])\n"
