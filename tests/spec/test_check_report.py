"""``featurestream check`` on mutants, run from outside the checkout: a counterexample summary, the lasso.

The real TLC runs the shipped mutants; the summary must name each step's
action and only what it changed, show a liveness violation's loop (never a
``depth None``), and leave TLC's raw dump to ``--verbose``. The parser is
also checked on TLC output written out here (a wrapped value, a lasso).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from featurestream.cli import main
from featurestream.spec.check import explain
from featurestream.spec.counterexample import changes, config_description, flatten, meaning, parse
from featurestream.spec.tlc import spec_dir

pytestmark = pytest.mark.timeout(900)


def check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """One worker: TLC's search, and so a safety counterexample, is then the same every run."""
    code = main(["check", *args, "--workers", "1"])
    return code, capsys.readouterr().out


def test_bug_a_from_another_directory_is_summarised_step_by_step(
    tlc_available: None, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the relative config is found through the spec directory's checkout
    code, out = check(capsys, "--config", "spec/mutants/BugA.cfg")
    assert code == 1, out
    assert f"with {spec_dir() / 'mutants' / 'BugA.cfg'} ..." in out
    assert "Error: Invariant NoLoss is violated." in out
    # What the broken invariant means (the spec's own comment) and the known defect the mutant re-introduces.
    assert "what NoLoss means: 4. No loss: a pending or leased sample is resident, whatever stale consumers" in out
    assert "mutant BugA.cfg: Defect A (stale release frees a queued sample): BugStaleRelease = TRUE." in out
    assert re.search(r"^counterexample, 6 states \(\d+ variables\):$", out, re.M), out
    steps = re.findall(r"^  (\d+) (\w+)", out, re.M)
    assert steps == [
        ("1", "Init"),
        ("2", "ProducerStore"),
        ("3", "Enqueue"),
        ("4", "Acquire"),
        ("5", "Get"),
        ("6", "Release"),
    ]
    release = out[out.index("  6 Release: ") :].split("\n(")[0]
    # The stale release of defect A: the queued sample's retain dropped and its bytes freed, nothing else.
    assert "retained: {s1} -> {}" in release and "resident: {s1} -> {}" in release
    assert "status" not in release and "lease[" not in release
    assert "/\\ retained" not in out, "TLC's raw states are left to --verbose"
    assert re.search(r"^TLC: VIOLATED NoLoss; \d+ distinct states, \d+ generated, depth 6, ", out, re.M), out


def test_a_liveness_mutant_shows_its_loop_and_no_depth_none(
    tlc_available: None, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = check(capsys, "--config", "mutants/WeakEnqueueFairness.cfg")
    assert code == 1, out
    assert "Error: Temporal properties were violated." in out
    loop = re.search(r"^  lasso: states (\d+)-(\d+) repeat for ever \((\w+) leads from state (\d+) back", out, re.M)
    assert loop is not None, out
    start, end, action, last = loop.groups()
    steps = re.findall(r"^  (\d+) \w+", out, re.M)
    assert int(start) < int(end) == int(last) == len(steps), (
        "the loop starts inside the behaviour and closes at its end"
    )
    # Which of the producer's two steps closes the loop depends on the order TLC's workers explore in.
    assert action in {"ProducerStore", "Enqueue"}, out
    assert "VIOLATED ProducerProgress" in out and "depth None" not in out


def test_a_stuttering_liveness_counterexample_says_where_it_stutters(
    tlc_available: None, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = check(capsys, "--config", "spec/mutants/BugProducerBytesCounted.cfg")
    assert code == 1, out
    # TLC finds it on the graph explored so far, at a moment that varies: which producer and id vary, the
    # shape does not (both producers store, the queue pauses, nothing is queued, they wait for ever).
    assert re.search(r'^  \d+ PauseP: bp: "flowing" -> "paused"$', out, re.M), out
    stutter = re.search(r"^  lasso: the behaviour stutters in state (\d+) for ever$", out, re.M)
    assert stutter is not None, out
    assert stutter.group(1) == re.findall(r"^  (\d+) \w+", out, re.M)[-1], "it stutters in its last state"
    assert "depth None" not in out


def test_a_config_found_nowhere_lists_where_it_looked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--config", "spec/mutants/Nope.cfg"]) == 2
    out = capsys.readouterr().out
    assert "TLC config 'spec/mutants/Nope.cfg' not found" in out
    assert str(tmp_path / "spec" / "mutants" / "Nope.cfg") in out and str(spec_dir() / "mutants" / "Nope.cfg") in out


TLC_OUTPUT = """\
Error: Temporal properties were violated.

Error: The following behavior constitutes a counter-example:

State 1: <Initial predicate>
/\\ queue = <<>>
/\\ lease = (s1 :> (0 :> "none" @@ 1 :> "none") @@ s2 :> (0 :> "none" @@ 1 :> "none"))
/\\ held = (c1 :> {} @@ c2 :> {})

State 2: <Acquire line 246, col 5 to line 255, col 86 of module LeaseQueue>
/\\ queue = <<>>
/\\ lease = ( s1 :> (0 :> "leased" @@ 1 :> "none") @@
  s2 :> (0 :> "none" @@ 1 :> "none") )
/\\ held = (c1 :> {<<s1, 0>>} @@ c2 :> {})

State 3: <Crash line 325, col 5 to line 328, col 99 of module LeaseQueue>
/\\ queue = <<s2>>
/\\ lease = (s1 :> (0 :> "leased" @@ 1 :> "none") @@ s2 :> (0 :> "none" @@ 1 :> "none"))
/\\ held = (c1 :> {} @@ c2 :> {})

Back to state 2: <Acquire line 246, col 5 to line 255, col 86 of module LeaseQueue>

Finished checking temporal properties in 00s
"""


def test_the_parser_reads_wrapped_values_and_the_lasso() -> None:
    trace = parse(TLC_OUTPUT)
    assert trace is not None
    assert [(s.number, s.action) for s in trace.states] == [(1, "Init"), (2, "Acquire"), (3, "Crash")]
    assert (trace.loop_to, trace.loop_action, trace.stutters) == (2, "Acquire", False)
    assert trace.describe() == [
        "counterexample, 3 states (3 variables):",
        "  1 Init",
        '  2 Acquire: lease[s1][0]: "none" -> "leased"; held[c1]: {} -> {<<s1, 0>>}',
        "  3 Crash: queue: <<>> -> <<s2>>; held[c1]: {<<s1, 0>>} -> {}",
        "  lasso: states 2-3 repeat for ever (Acquire leads from state 3 back to state 2)",
    ]


def test_flatten_splits_functions_only_at_their_own_level() -> None:
    value = '(c1 :> {<<s1, 0>>, <<s2, 1>>} @@ c2 :> "a :> b @@ c")'
    assert flatten("held", value) == {"held[c1]": "{<<s1, 0>>, <<s2, 1>>}", "held[c2]": '"a :> b @@ c"'}
    assert flatten("queue", "<<s1, s2>>") == {"queue": "<<s1, s2>>"}
    assert changes({"x": "(a :> 1)"}, {"x": "(a :> 1 @@ b :> 2)"}) == ["x: (a :> 1) -> (a :> 1 @@ b :> 2)"]
    assert parse("No error has been found.\n") is None


def test_meaning_is_the_comment_the_spec_gives_the_definition() -> None:
    spec = (spec_dir() / "LeaseQueue.tla").read_text()
    assert meaning(spec, "BoundedDelivery") == "7. Bounded delivery: redelivery_count < max_deliveries."
    # A boxed comment above a helper definition glued to this one is still its comment.
    cap = meaning(spec, "SampleCapRoom")
    assert cap is not None and cap.startswith("14. The count cap.") and cap.endswith("BugOnlyBytes breaks it.")
    assert meaning(spec, "TypeOK") is None and meaning(spec, "NoSuchInvariant") is None
    text = "\n(* Safety: one. *)\n(* two. *)\nOne == TRUE\n\nTwo == FALSE\n"
    assert meaning(text, "One") == "Safety: one. two." and meaning(text, "Two") is None


def test_explain_names_the_meaning_the_mutant_and_a_deadlock(tmp_path: Path) -> None:
    mutant = spec_dir() / "mutants" / "BugB.cfg"
    lines = explain("NoLeak", mutant, spec_dir() / "LeaseQueue.tla")
    assert lines[0].startswith("what NoLeak means: 5. No leak: a settled or discarded sample's bytes have left")
    described = " ".join(line.strip() for line in lines)
    assert "mutant BugB.cfg: Defect B (crashed consumer's handle keeps a settled sample): BugNoScrub = TRUE." in (
        described
    )
    assert all(len(line) <= 110 for line in lines), lines
    assert explain("<deadlock>", None, None)[0].startswith("what a deadlock means: TLC reached a state from which")
    plain = tmp_path / "Plain.cfg"
    plain.write_text("SPECIFICATION Spec\n")
    assert config_description(plain.read_text()) is None
    assert explain("<temporal>", plain, spec_dir() / "LeaseQueue.tla") == [], "nothing known, nothing said"
    model = explain(None, spec_dir() / "LeaseQueue.cfg", None)
    assert model[0].startswith("model LeaseQueue.cfg: CI model: every invariant"), model
