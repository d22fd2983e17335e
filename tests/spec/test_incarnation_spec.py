"""The real TLC on spec/Incarnation.tla (an id put, settled and re-put; stale refs and handles), deadlock checking on.

The shipped model is clean with its state count pinned; the mutant whose handles carry no incarnation yields the
counterexample the stores had (a stale release after a re-put frees the new put); ``featurestream check`` runs both.
"""

from __future__ import annotations

import pytest

from featurestream.spec.tlc import TLCResult, spec_dir

from .tlc_runs import tlc

pytestmark = pytest.mark.timeout(600)

INCARNATION_DISTINCT_STATES = 2_661  # spec/Incarnation.cfg
MUTANT = "mutants/IncarnationHandlesWithoutIncarnation.cfg"


def _run(config: str) -> TLCResult:
    module = spec_dir() / "Incarnation.tla"
    return tlc(spec_dir() / config, modules=[module], main_module="Incarnation.tla", check_deadlock=True, workers=1)


def test_the_incarnation_model_has_no_error_and_the_pinned_state_count(tlc_available: None) -> None:
    result = _run("Incarnation.cfg")
    print(result.summary())
    assert "-deadlock" not in result.command
    assert result.ok, result.output[-4000:]
    assert result.distinct_states == INCARNATION_DISTINCT_STATES


def test_handles_without_incarnation_let_a_stale_release_free_the_re_put_sample(tlc_available: None) -> None:
    assert "BugHandlesWithoutIncarnation = TRUE" in (spec_dir() / MUTANT).read_text()
    result = _run(MUTANT)
    print(result.summary())
    assert "-deadlock" not in result.command
    assert not result.ok and result.violated == "IncarnationsNeverCross", result.output[-4000:]
    # The counterexample: put, get, scrub, put again, the stale handle's release frees the second put.
    steps = [line.split(" ")[1] for line in result.output.splitlines() if line.startswith("State ")]
    assert steps == ["1:", "2:", "3:", "4:", "5:", "6:"], result.output[-4000:]
    assert '<<"free", 1, 2>>' in result.output


def test_check_command_runs_the_incarnation_model(tlc_available: None, capsys: pytest.CaptureFixture[str]) -> None:
    from featurestream.cli import main

    assert main(["check", "--config", "spec/Incarnation.cfg", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "Incarnation.tla with" in out and f"TLC: no error; {INCARNATION_DISTINCT_STATES} distinct states" in out
    assert main(["check", "--config", f"spec/{MUTANT}", "--workers", "1"]) == 1
    out = capsys.readouterr().out
    assert "TLC: VIOLATED IncarnationsNeverCross" in out and "Release" in out
