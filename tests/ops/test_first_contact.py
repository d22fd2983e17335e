"""How long a first connection is tried, as docs/redis.md states: 2 s by the operator commands (a queue: 3 s,
``tests/backends/redis/test_redis_queue.py``)."""

from __future__ import annotations

import socket

import pytest

from featurestream.cli import main


@pytest.mark.parametrize("command", [["status"], ["dead-letters", "list"]])
def test_the_operator_commands_try_a_first_connection_for_2_s(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"redis://127.0.0.1:{sock.getsockname()[1]}/0"  # bound, not listening: connections are refused
        status = main([*command, "--redis", url, "--name", "q"])
    err = capsys.readouterr().err
    assert status == 2 and "cannot reach Redis" in err
    assert "tried for 2 s" in err and "reconnect_timeout=2 s" in err
