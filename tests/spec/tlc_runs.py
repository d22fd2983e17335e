"""``tlc``: ``run_tlc`` with each exhaustive check run once per test run.

A model's own test and the test of ``featurestream check`` on it (``conftest.py`` hands the CLI this runner)
read one TLC run: every shipped model and mutant is checked once per CI run. Under pytest-xdist the workers of
one run share their results through a directory (``share``): the first worker to ask for a check runs it under a
file lock, the others wait for it and read its result.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from featurestream.spec.tlc import MODULE, TLCResult, run_tlc

__all__ = ["TLCRuns", "tlc"]


class TLCRuns:
    """``run_tlc`` with the same arguments, each exhaustive check run once per test run (a simulation every time)."""

    def __init__(self) -> None:
        self._results: dict[tuple[object, ...], TLCResult] = {}
        self._shared: Path | None = None

    def share(self, directory: Path) -> None:
        """Keep results in ``directory`` too, and read them from there: every process given it runs a check once."""
        directory.mkdir(parents=True, exist_ok=True)
        self._shared = directory

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
            self._results[key] = self._once(
                key,
                lambda: run_tlc(
                    config, modules=modules, main_module=main_module, workers=workers, check_deadlock=deadlock,
                    **options,  # type: ignore[arg-type]
                ),
            )  # fmt: skip
        return self._results[key]

    def _once(self, key: tuple[object, ...], run: Callable[[], TLCResult]) -> TLCResult:
        if self._shared is None:
            return run()
        name = hashlib.sha256(repr(key).encode()).hexdigest()[:24]
        saved = self._shared / f"{name}.json"
        with open(self._shared / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # held while another process runs this check
            if saved.exists():
                fields = json.loads(saved.read_text())
                return TLCResult(**{**fields, "command": tuple(fields["command"])})
            result = run()
            partial = saved.with_suffix(f".{os.getpid()}")
            partial.write_text(json.dumps(dataclasses.asdict(result)))
            partial.replace(saved)
            return result


tlc = TLCRuns()
