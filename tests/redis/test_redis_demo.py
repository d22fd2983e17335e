"""``featurestream demo --redis URL``: the full pipeline across the Redis queue."""

from __future__ import annotations

from typing import Any

import pytest

from featurestream.cli import main

pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")


def test_demo_runs_the_pipeline_over_redis(redis_server: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--redis", redis_server.url, "--samples", "24", "--no-progress", "--crash-every", "7"]) == 0
    out = capsys.readouterr().out
    assert f"queue RedisSampleRefQueue at {redis_server.url}," in out.splitlines()[0]
    assert "[ok] every sample put was acked exactly once" in out
    assert "[ok] nothing pending, leased or resident at the end" in out
