"""``featurestream demo --redis URL``: the full pipeline across the Redis queue."""

from __future__ import annotations

import re
from typing import Any

import pytest

from featurestream.cli import main

pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")


def test_demo_runs_the_pipeline_over_redis(redis_server: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--redis", redis_server.url, "--samples", "24", "--no-progress", "--crash-every", "7"]) == 0
    out = capsys.readouterr().out
    shown = re.search(rf"queue RedisSampleRefQueue '(demo-[0-9a-f]{{12}})' at {re.escape(redis_server.url)} ", out)
    assert shown is not None, out.splitlines()[0]
    assert main(["status", "--redis", redis_server.url, "--name", shown.group(1)]) == 0  # the name status needs
    assert "[ok] every sample put was acked exactly once" in out
    assert "[ok] nothing pending, leased or resident at the end" in out
