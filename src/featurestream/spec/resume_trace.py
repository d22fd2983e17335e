"""Trace validation of resuming: is a recorded behaviour of the implementation one ``spec/Resume.tla`` allows?

A trace is a sequence of states as the spec's variables, recorded by the
resume state machine (``featurestream.testing.resume_machine``, ``traces=``)
from the real ledger and queue after every action. ``validate_resume_traces``
renders them as one module ``ResumeTrace`` that EXTENDS Resume: a trace ``tr``
chosen in the initial state, a cursor ``i``, and each step of the trace
required to be a ``Next`` step of the spec (or a stutter) into exactly the
next recorded state. TLC runs with deadlock checking on: a trace that leaves
the spec has no successor before its end, which TLC reports as a deadlock,
with ``tr`` and ``i`` naming the trace and the step; the end of a trace is an
explicit terminal step.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from featurestream.spec.tlc import TLCResult, run_tlc, spec_dir

__all__ = ["validate_resume_traces"]

_VARIABLES = (
    "gen",
    "trained",
    "queue",
    "alive",
    "model",
    "batch",
    "phase",
    "expired",
    "ckpt",
    "palive",
    "seen",
    "inflight",
    "crashes",
)


def _tla(value: Any) -> str:
    """``value`` as a TLA+ expression: bools, ints, strings, key -> value functions, sequences; a pair is
    ``[key, generation]``, a set of pairs a sorted list of them (``queue``, ``inflight``)."""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "(" + " @@ ".join(f"{_tla(k)} :> {_tla(v)}" for k, v in value.items()) + ")"
    return "<<" + ", ".join(_tla(item) for item in value) + ">>"


def _state(state: Mapping[str, Any]) -> str:
    fields = []
    for name in _VARIABLES:
        value = state[name]
        if name in ("queue", "inflight"):
            text = "{" + ", ".join(_tla(pair) for pair in value) + "}"
        elif name == "batch":
            text = "None" if value is None else _tla(value)
        elif name == "ckpt":
            text = f"[step |-> {value['step']}, model |-> {_tla(value['model'])}]"
        else:
            text = _tla(value)
        fields.append(f"{name} |-> {text}")
    return "[" + ", ".join(fields) + "]"


def _module(traces: Sequence[Sequence[Mapping[str, Any]]]) -> str:
    rendered = ",\n  ".join("<<" + ", ".join(_state(s) for s in trace) + ">>" for trace in traces)
    assign = " /\\ ".join(f"{name}' = Trace[tr][i + 1].{name}" for name in _VARIABLES)
    start = " /\\ ".join(f"{name} = Trace[tr][1].{name}" for name in _VARIABLES)
    return f"""---- MODULE ResumeTrace ----
EXTENDS Resume, TLC
Trace == <<
  {rendered}
>>
VARIABLES tr, i
TraceInit == tr \\in 1..Len(Trace) /\\ i = 1 /\\ {start}
TraceStep == i < Len(Trace[tr]) /\\ (Next \\/ UNCHANGED vars) /\\ {assign} /\\ i' = i + 1 /\\ UNCHANGED tr
TraceEnd == i = Len(Trace[tr]) /\\ UNCHANGED <<vars, tr, i>>
TraceSpec == TraceInit /\\ [][TraceStep \\/ TraceEnd]_<<vars, tr, i>>
====
"""


def validate_resume_traces(
    traces: Sequence[Sequence[Mapping[str, Any]]], prompts: Sequence[str], max_crashes: int, *, timeout: float = 600
) -> TLCResult:
    """Have TLC check that every trace (states as ``Resume.tla``'s variables) is a behaviour of the spec.

    ``ok`` when each trace reaches its end; a trace that leaves the spec is a
    deadlock in TLC's output, whose last state names ``tr`` (the trace's
    1-based index) and ``i`` (the last step the spec allowed). The first
    state of each trace must be the spec's ``Init``.
    """
    if not traces or any(not trace for trace in traces):
        raise ValueError(f"validate_resume_traces needs non-empty traces, got {len(traces)} traces")
    with tempfile.TemporaryDirectory(prefix="featurestream-resume-trace-") as scratch:
        work = Path(scratch)
        module = work / "ResumeTrace.tla"
        module.write_text(_module(traces))
        config = work / "ResumeTrace.cfg"
        names = ", ".join(_tla(prompt) for prompt in prompts)
        config.write_text(
            "SPECIFICATION TraceSpec\n"
            f"CONSTANTS\n    Prompts = {{{names}}}\n    MaxCrashes = {max_crashes}\n"
            "    BugNoLedger = FALSE\n    BugNoAdmission = FALSE\n"
            "INVARIANTS\n    TypeOK\n    AtMostOnce\n    LedgerMatchesModel\n"
        )
        spec = spec_dir() / "Resume.tla"
        return run_tlc(
            config,
            modules=[spec, module],
            main_module="ResumeTrace.tla",
            check_deadlock=True,
            workers=1,
            timeout=timeout,
        )
