"""``featurestream check``: model-check ``spec/LeaseQueue.tla`` (or ``spec/Resume.tla``) with TLC, print the verdict.

TLC runs as a reviewer would run it by hand: deadlock checking on. A
violation is printed with what the violated invariant or property means (the
spec's comment on its definition), what the config stands for (a mutant: the
known defect it re-introduces, from the config's header comment) and a summary
of TLC's counterexample (each step's action and what it changed; for liveness,
the loop); ``--verbose`` adds TLC's own output. A relative ``--config`` is looked up in the working directory, then
in the spec directory and the checkout it belongs to, so
``--config spec/mutants/BugA.cfg`` works from anywhere. A config named
``Resume*.cfg`` (``--resume``, ``spec/mutants/ResumeNoLedger.cfg``) checks the
checkpoint/restore model ``spec/Resume.tla``, one named ``Incarnation*.cfg`` the
incarnation model ``spec/Incarnation.tla``, one named ``Orphan*.cfg`` the orphan reclaim
model ``spec/OrphanReclaim.tla``, one named ``Replicated*.cfg`` the failover model ``spec/ReplicatedQueue.tla``,
one named ``BufferReuse*.cfg`` the pooled stores' reuse model ``spec/BufferReuse.tla``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from featurestream.spec import counterexample
from featurestream.spec.tlc import MODULE, Simulation, TLCResult, ToolMissing, run_tlc, spec_dir

CI_CONFIG = "LeaseQueue.cfg"
WINDOW_CONFIG = "LeaseQueueWindow.cfg"
KEEP_CONFIG = "LeaseQueueKeep.cfg"
DEEP_CONFIG = "LeaseQueueDeep.cfg"
SIM_CONFIG = "LeaseQueueSim.cfg"
RESUME_CONFIG = "Resume.cfg"
RESUME_MODULE = "Resume.tla"
# The models named by an option of their own: option -> (config, what it models), for --help and run().
NAMED_MODELS = {
    "deep": (DEEP_CONFIG, "the larger nightly model"),
    "window": (WINDOW_CONFIG, "the dedup-window eviction model"),
    "keep": (KEEP_CONFIG, "the dead-letter repair model: requeue, purge"),
    "resume": (RESUME_CONFIG, "the checkpoint/restore model: exactly-once training across restarts"),
}
# Modules of their own, picked by the config's name prefix; any other config checks LeaseQueue.tla.
SEPARATE_MODULES = {
    "Resume": RESUME_MODULE,
    "Incarnation": "Incarnation.tla",
    "Orphan": "OrphanReclaim.tla",
    "Replicated": "ReplicatedQueue.tla",
    "BufferReuse": "BufferReuse.tla",
}


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``check`` options to ``parser``."""
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--config",
        type=Path,
        help="a TLC model config, relative to the working directory or the spec directory "
        "(default: the CI model, spec/LeaseQueue.cfg)",
    )
    for name, (config, models) in NAMED_MODELS.items():
        which.add_argument(f"--{name}", action="store_true", help=f"{models} (spec/{config})")
    parser.add_argument(
        "--simulate",
        action="store_true",
        help="random simulation instead of exhaustive search (default config: spec/LeaseQueueSim.cfg)",
    )
    parser.add_argument("--depth", type=int, default=100, help="simulation: steps per behaviour (default 100)")
    parser.add_argument("--seconds", type=float, default=60.0, help="simulation: wall-time bound (default 60)")
    parser.add_argument("--seed", type=int, default=None, help="simulation: TLC's random seed")
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="TLC worker threads (default: all cores)"
    )
    parser.add_argument("--verbose", action="store_true", help="print TLC's full output")


def run(args: argparse.Namespace) -> int:
    """Run TLC; exit 0 when no error is found, 1 on a violation, 2 when TLC cannot run."""
    try:
        named = [config for name, (config, _) in NAMED_MODELS.items() if getattr(args, name)]
        if args.config:
            config = find_config(args.config)
        elif named:  # the options are mutually exclusive: at most one
            config = spec_dir() / named[0]
        else:
            config = spec_dir() / (SIM_CONFIG if args.simulate else CI_CONFIG)
        simulate = (
            Simulation(depth=args.depth, seconds=args.seconds, seed=args.seed, traces=None) if args.simulate else None
        )
        mode = f"simulating ({args.depth} steps, {args.seconds:g} s)" if simulate else "model-checking"
        module = next((m for prefix, m in SEPARATE_MODULES.items() if Path(config).name.startswith(prefix)), MODULE)
        print(f"{mode} {spec_dir() / module} with {config} ...", flush=True)
        modules = [spec_dir() / module] if module != MODULE else []
        result = run_tlc(
            config, workers=args.workers, simulate=simulate, modules=modules, main_module=module, check_deadlock=True
        )
    except (ToolMissing, FileNotFoundError, ValueError) as error:
        print(f"featurestream check: {error}")
        return 2
    if args.verbose:
        print(result.output)
    if not result.ok:
        print("\n".join(report(result, verbose=args.verbose, config=Path(config), module=spec_dir() / module)))
    print(result.summary())
    return 0 if result.ok else 1


def find_config(config: Path) -> Path:
    """``config`` itself when absolute; else the first that exists of it under the working directory, the spec
    directory and the directory above it (a checkout's root). ``FileNotFoundError`` lists where it looked."""
    if config.is_absolute():
        return config
    spec = spec_dir()
    places = [Path.cwd(), spec, spec.parent]
    candidates = [place / config for place in places]
    if config.parts[:1] == ("spec",):  # spec/... from an installed wheel, whose spec directory is _spec
        candidates.append(spec.joinpath(*config.parts[1:]))
    candidates = list(dict.fromkeys(candidates))  # run from the spec directory, two places are one
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    looked = ", ".join(str(candidate) for candidate in candidates)
    raise FileNotFoundError(f"TLC config {str(config)!r} not found; looked for {looked}")


DEADLOCK = (
    "TLC reached a state from which no step of the spec is possible: the model is stuck there for ever "
    "(deadlock checking is on)"
)


def report(result: TLCResult, *, verbose: bool, config: Path | None = None, module: Path | None = None) -> list[str]:
    """What a violation prints: TLC's error lines, what the violated name means in ``module`` and what
    ``config`` stands for (both when known), and the summary of TLC's counterexample."""
    lines = [line for line in result.output.splitlines() if line.startswith("Error:") and "behavior" not in line]
    lines += explain(result.violated, config, module)
    trace = counterexample.parse(result.output)
    if trace is not None:
        lines += trace.describe()
    elif not verbose:
        lines.append(result.output)  # no behaviour to summarise (a parse or setup error): TLC's words are all there is
    if trace is not None and not verbose:
        lines.append("(--verbose prints TLC's full output, every variable of every state)")
    return lines


def explain(violated: str | None, config: Path | None, module: Path | None) -> list[str]:
    """``what <name> means: ...`` (the spec's comment on the violated definition, or what a deadlock is) and
    ``mutant: ...`` / ``model: ...`` (the config's header comment), each wrapped; what is unknown is left out."""
    lines: list[str] = []
    if violated == "<deadlock>":
        lines += counterexample.wrap("what a deadlock means: ", DEADLOCK)
    elif violated is not None and module is not None and module.is_file():
        text = counterexample.meaning(module.read_text(), violated)
        if text is not None:
            lines += counterexample.wrap(f"what {violated} means: ", text)
    if config is not None and config.is_file():
        text = counterexample.config_description(config.read_text())
        if text is not None:
            kind = "mutant" if config.parent.name == "mutants" else "model"
            lines += counterexample.wrap(f"{kind} {config.name}: ", text)
    return lines
