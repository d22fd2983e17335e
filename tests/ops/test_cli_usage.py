"""The operator commands' usage errors: exit status 2 with a message, before any connection is tried."""

from __future__ import annotations

import pytest

from featurestream.cli import main
from featurestream.ops.target import redact

# Nothing listens on port 1: a command that tried to connect would say "cannot reach Redis" instead.
NOWHERE = "redis://127.0.0.1:1/0"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's own errors
        status = int(exc.code or 0)
    return status, capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["status", "--name", "q", "--watch", "0"], "--watch: must be > 0 and finite, got '0'"),
        (["status", "--name", "q", "--watch", "nan"], "--watch: must be > 0 and finite, got 'nan'"),
        (["status", "--name", "q", "--count", "2"], "--count needs --watch"),
        (["dead-letters", "requeue", "--name", "q"], "name the sample ids to requeue, or pass --all"),
        (["dead-letters", "purge", "--name", "q", "s1", "--all"], "either sample ids or --all, not both"),
        (["dead-letters", "list", "--name", "q", "s1"], "unrecognized arguments: s1"),
        (["dead-letters", "--redis", NOWHERE, "--name", "q"], "argument ACTION: invalid choice"),  # action first
    ],
)
def test_usage_errors_exit_2_without_connecting(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    target = ["--redis", NOWHERE] if argv[1] != "--redis" else []
    status, err = run([*argv, *target], capsys)
    assert status == 2 and message in err and "cannot reach" not in err


def test_redis_url_defaults_to_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("FEATURESTREAM_REDIS_URL", raising=False)
    status, err = run(["status", "--name", "q"], capsys)
    assert status == 2 and "one of the arguments --redis --sentinel is required" in err
    monkeypatch.setenv("FEATURESTREAM_REDIS_URL", NOWHERE)
    status, err = run(["status", "--name", "q"], capsys)
    assert status == 2 and f"queue 'q' at {NOWHERE}" in err


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:s3cret@db:6379/2", "redis://:***@db:6379/2"),
        ("rediss://admin:s3cret@db/0", "rediss://admin:***@db/0"),
        ("unix:///run/redis.sock?db=1", "unix:///run/redis.sock?db=1"),
    ],
)
def test_redact_hides_only_the_password(url: str, shown: str) -> None:
    assert redact(url) == shown
