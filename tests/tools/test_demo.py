"""``featurestream demo`` end to end: its own checks must pass, on both stores, with faults injected."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from featurestream.cli import main
from featurestream.stores.arena import entries


@pytest.mark.parametrize("store", ["local", "shared-dir"])
def test_demo_streams_trains_and_checks_its_summary(
    store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["demo", "--samples", "40", "--crash-every", "15", "--fail-rate", "0.1", "--visibility-timeout", "0.3"]
    args += ["--store", store, "--seed", "3"]
    if store == "shared-dir":
        args += ["--dir", str(tmp_path / "features")]
    else:
        args += ["--render", str(tmp_path / "queue.dot")]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "FAILED" not in out and out.count("[ok]") == 6, out
    assert "every sample put was acked exactly once" in out and "the draft's loss fell" in out
    assert "40/40 acked" in err, "the progress bar reaches the end"
    reclaimed, crashes = map(int, re.search(r"(\d+) leases reclaimed after (\d+) consumer crashes", out).groups())
    assert reclaimed >= crashes >= 2, "every crash's lease was reclaimed and redelivered"
    if store == "shared-dir":
        assert entries(tmp_path / "features") == []
    else:
        snapshot = (tmp_path / "queue.dot").read_text()
        assert "acked" in snapshot and "40 so far" in snapshot and "drained" in snapshot


def test_demo_rejects_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--fail-rate", "1.5"])
    assert "must be in [0, 1)" in capsys.readouterr().err
