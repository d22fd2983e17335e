"""The real TLC on spec/BufferReuse.tla (a writer reusing slots, readers copying and mapping, scrubs at any time).

Deadlock checking on. The shipped model is clean with its state count pinned; the two mutants -- a writer that
recycles a slot a reader still holds, a reader that skips the check that its name still names the file it
opened -- each yield a read of a later incarnation's bytes.
"""

from __future__ import annotations

import pytest

from featurestream.spec.tlc import TLCResult, spec_dir

from .tlc_runs import tlc

pytestmark = pytest.mark.timeout(600)

DISTINCT_STATES = 17_527  # spec/BufferReuse.cfg


def _run(config: str) -> TLCResult:
    module = spec_dir() / "BufferReuse.tla"
    return tlc(spec_dir() / config, modules=[module], main_module="BufferReuse.tla", check_deadlock=True, workers=1)


def test_the_reuse_model_has_no_error_and_the_pinned_state_count(tlc_available: None) -> None:
    result = _run("BufferReuse.cfg")
    print(result.summary())
    assert "-deadlock" not in result.command
    assert result.ok, result.output[-4000:]
    assert result.distinct_states == DISTINCT_STATES


@pytest.mark.parametrize(
    ("mutant", "switch"),
    [
        ("mutants/BufferReuseWhileHeld.cfg", "BugReuseWhileHeld = TRUE"),
        ("mutants/BufferReuseNoNameCheck.cfg", "BugNoNameCheck = TRUE"),
    ],
)
def test_a_reuse_mutant_lets_an_old_handle_read_a_later_sample(tlc_available: None, mutant: str, switch: str) -> None:
    assert switch in (spec_dir() / mutant).read_text()
    result = _run(mutant)
    print(result.summary())
    assert "-deadlock" not in result.command
    assert not result.ok and result.violated == "ReadersSeeTheirOwn", result.output[-4000:]
    assert "<<1, 2>>" in result.output, "the handle of incarnation 1 read incarnation 2's bytes"


def test_check_command_runs_the_reuse_model(tlc_available: None, capsys: pytest.CaptureFixture[str]) -> None:
    from featurestream.cli import main

    assert main(["check", "--config", "spec/BufferReuse.cfg", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert (
        "BufferReuse.tla with" in out and f"TLC: no error; {DISTINCT_STATES:,} distinct states".replace(",", "") in out
    )
