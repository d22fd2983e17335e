"""``tlc``: ``run_tlc`` with each exhaustive check run once per test session.

A model's own test and the test of ``featurestream check`` on it (``conftest.py`` hands the CLI this runner)
read one TLC run: every shipped model and mutant is checked once per CI run.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from featurestream.spec.tlc import MODULE, TLCResult, run_tlc

__all__ = ["TLCRuns", "tlc"]


class TLCRuns:
    """``run_tlc`` with the same arguments, each exhaustive check run once per session (a simulation every time)."""

    def __init__(self) -> None:
        self._results: dict[tuple[object, ...], TLCResult] = {}

    def __call__(
        self,
        config: Path | str,
        *,
        modules: Iterable[Path | str] = (),
        main_module: str = MODULE,
        workers: int = 2,
        check_deadlock: bool | None = None,
        **options: object,
    ) -> TLCResult:
        modules = list(modules)
        if options.get("simulate") is not None or options.get("extra_args"):
            return run_tlc(
                config, modules=modules, main_module=main_module, workers=workers, check_deadlock=check_deadlock,
                **options,  # type: ignore[arg-type]
            )  # fmt: skip
        deadlock = main_module == MODULE if check_deadlock is None else check_deadlock
        key = (Path(config).resolve(), main_module, tuple(sorted(str(Path(m).resolve()) for m in modules)))
        key += (deadlock, workers)
        if key not in self._results:
            self._results[key] = run_tlc(
                config, modules=modules, main_module=main_module, workers=workers, check_deadlock=deadlock,
                **options,  # type: ignore[arg-type]
            )  # fmt: skip
        return self._results[key]


tlc = TLCRuns()
