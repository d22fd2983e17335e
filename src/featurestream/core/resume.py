"""The training ledger: which prompt each committed training step trained, held by the queue backend.

A resumable producer names the sample of prompt ``key`` (generation ``g``)
``sample_id_for(run_id, key, g)``; the loader reads the key back with
``parse_sample_id``. The ledger (``queue.training_ledger()``) records, per
data-parallel rank, the keys each committed step trained; a restore rolls a
rank's history back to a checkpoint's step, and the producer asks it which
keys still have to be produced. ``docs/resume.md`` states the protocol and
``spec/Resume.tla`` models it.

``MemoryLedger`` is the in-process queue's; ``RedisTrainingLedger``
(``featurestream.backends.redis.resume``) keeps the same state in Redis.
"""

from __future__ import annotations

import abc
import dataclasses
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

from featurestream.common.checks import check_count
from featurestream.common.errors import FeatureStreamError

__all__ = [
    "LedgerProgress",
    "MemoryLedger",
    "Restore",
    "StaleTrainer",
    "TrainingLedger",
    "check_key",
    "check_rank_step",
    "parse_sample_id",
    "sample_id_for",
]

_MARK = "#prompt="
_GENERATION = "#g"
# What a key may hold: it sits inside sample ids, which stores use as file or object names.
_KEY = re.compile(r"[A-Za-z0-9_.:=+-]+")


def check_key(key: object) -> str:
    """``key`` must be a non-empty ``str`` of letters, digits and ``_.:=+-`` without ``..``; returned as is."""
    if not isinstance(key, str) or not _KEY.fullmatch(key) or ".." in key:
        raise ValueError(
            f"a prompt key must be a non-empty str of letters, digits and _.:=+- without '..', got {key!r}"
        )
    return key


def sample_id_for(run_id: str, key: str, generation: int) -> str:
    """The sample id of prompt ``key``'s sample of ``generation`` (``parse_sample_id`` reads it back)."""
    check_key(key)
    check_count("generation", generation, minimum=1)
    return f"{run_id}{_MARK}{key}{_GENERATION}{generation}"


def parse_sample_id(sample_id: str) -> tuple[str, int] | None:
    """Read back what ``sample_id_for`` wrote.

    Returns ``(key, generation)`` for a resumable producer's sample id ``"{run_id}#prompt={key}#g{generation}"``:
    ``key`` the prompt's key (a ``str`` that ``check_key`` accepts), ``generation`` the ``int`` (``>= 1``) of the
    sample that prompt was produced as (``1`` first, one more each time it is produced again after a restore).
    Returns ``None`` for any other id: the sample is not tracked by the training ledger.
    """
    head, _, tail = sample_id.rpartition(_GENERATION)
    if not tail.isdigit() or not tail.isascii():
        return None
    _, mark, key = head.rpartition(_MARK)
    if not mark or not _KEY.fullmatch(key):
        return None
    return key, int(tail)


class StaleTrainer(FeatureStreamError, RuntimeError):
    """A commit from an incarnation of a rank that a later restore superseded."""


@dataclasses.dataclass(frozen=True)
class Restore:
    """What ``TrainingLedger.restore`` did: the rank's new incarnation and the keys it rolled back."""

    rank: int
    step: int
    incarnation: int
    rolled_back: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class LedgerProgress:
    """``declared`` keys, how many are ``trained``, how many restores happened, commits of trained keys."""

    declared: int
    trained: int
    restores: int
    duplicates: int

    @property
    def complete(self) -> bool:
        """Every declared key trained (and at least one declared)."""
        return self.declared > 0 and self.trained == self.declared


class TrainingLedger(abc.ABC):
    """Durable record of the prompt keys trained by each committed step of each data-parallel rank.

    Every method is atomic (one lock hold, one Redis script or transaction)
    and thread-safe. Keys not ``declare``d are not tracked: ``admit`` admits
    them and ``commit`` ignores them.
    """

    @abc.abstractmethod
    def declare(self, keys: Iterable[str]) -> int:
        """Add ``keys`` to the epoch (generation 0, untrained); keys already declared are kept; return how many
        were new."""

    @abc.abstractmethod
    def generations(self, keys: Sequence[str]) -> list[int | None]:
        """Each key's current generation (``None``: not declared)."""

    @abc.abstractmethod
    def claim(self, expected: Mapping[str, int]) -> dict[str, int]:
        """For each ``key -> generation``: if the key is untrained and still at that generation, move it to
        the next one. Return the claimed keys with their new generation (the sample to produce)."""

    @abc.abstractmethod
    def admit(self, samples: Sequence[tuple[str, int]]) -> list[bool]:
        """Whether each ``(key, generation)`` sample may be trained: undeclared, or untrained and current."""

    @abc.abstractmethod
    def restore(self, rank: int, step: int) -> Restore:
        """Roll ``rank``'s history back to ``step``: its keys trained after it become untrained; bump the
        rank's incarnation (its older incarnations' commits are refused from now on)."""

    @abc.abstractmethod
    def commit(self, rank: int, incarnation: int, step: int, keys: Sequence[str]) -> int:
        """Record ``keys`` as trained by ``rank``'s ``step``; ``StaleTrainer`` if ``incarnation`` is not the
        rank's latest (nothing recorded). Return how many keys were already trained (counted as duplicates)."""

    @abc.abstractmethod
    def progress(self) -> LedgerProgress: ...

    @abc.abstractmethod
    def history(self, rank: int) -> dict[int, list[str]]:
        """``rank``'s committed steps (after its rollbacks) and the keys each trained, by step."""

    @abc.abstractmethod
    def holds(self, sample_ids: Sequence[str]) -> set[str]:
        """Which of ``sample_ids`` the queue holds (pending or leased)."""


def check_rank_step(rank: object, step: object) -> None:
    """``rank`` and ``step`` must be ints >= 0."""
    check_count("rank", rank)
    check_count("step", step)


class MemoryLedger(TrainingLedger):
    """The in-process queue's ledger; ``holds`` asks that queue (``SampleRefQueue.training_ledger``)."""

    def __init__(self, holds: Callable[[Sequence[str]], set[str]]) -> None:
        self._holds = holds
        self._lock = threading.Lock()
        self._generation: dict[str, int] = {}
        self._trained: dict[str, tuple[int, int]] = {}  # key -> (rank, step)
        self._steps: dict[int, dict[int, list[str]]] = {}  # rank -> step -> keys
        self._incarnation: dict[int, int] = {}
        self._restores = 0
        self._duplicates = 0

    def declare(self, keys: Iterable[str]) -> int:
        wanted = [check_key(key) for key in keys]
        with self._lock:
            new = [key for key in dict.fromkeys(wanted) if key not in self._generation]
            for key in new:
                self._generation[key] = 0
            return len(new)

    def generations(self, keys: Sequence[str]) -> list[int | None]:
        with self._lock:
            return [self._generation.get(key) for key in keys]

    def claim(self, expected: Mapping[str, int]) -> dict[str, int]:
        with self._lock:
            claimed = {}
            for key, generation in expected.items():
                if key not in self._trained and self._generation.get(key) == generation:
                    self._generation[key] = claimed[key] = generation + 1
            return claimed

    def admit(self, samples: Sequence[tuple[str, int]]) -> list[bool]:
        with self._lock:
            return [self._admits(key, generation) for key, generation in samples]

    def _admits(self, key: str, generation: int) -> bool:
        current = self._generation.get(key)
        return current is None or (key not in self._trained and current == generation)

    def restore(self, rank: int, step: int) -> Restore:
        check_rank_step(rank, step)
        with self._lock:
            steps = self._steps.setdefault(rank, {})
            later = sorted(s for s in steps if s > step)
            rolled_back = tuple(key for s in later for key in steps.pop(s))
            for key in rolled_back:
                del self._trained[key]
            incarnation = self._incarnation[rank] = self._incarnation.get(rank, 0) + 1
            self._restores += 1
            return Restore(rank, step, incarnation, rolled_back)

    def commit(self, rank: int, incarnation: int, step: int, keys: Sequence[str]) -> int:
        check_rank_step(rank, step)
        with self._lock:
            latest = self._incarnation.get(rank)
            if latest != incarnation:
                raise StaleTrainer(
                    f"rank {rank} incarnation {incarnation} may not commit step {step}: the rank was restored "
                    f"since (latest incarnation {latest}); a newer trainer owns this rank"
                )
            duplicates = 0
            recorded = self._steps.setdefault(rank, {}).setdefault(step, [])
            for key in keys:
                if key not in self._generation:
                    continue
                if key in self._trained:
                    duplicates += self._trained[key] != (rank, step)  # a retried commit of this step is none
                    continue
                self._trained[key] = (rank, step)
                recorded.append(key)
            if not recorded:
                del self._steps[rank][step]
            self._duplicates += duplicates
            return duplicates

    def progress(self) -> LedgerProgress:
        with self._lock:
            return LedgerProgress(len(self._generation), len(self._trained), self._restores, self._duplicates)

    def history(self, rank: int) -> dict[int, list[str]]:
        with self._lock:
            return {step: list(keys) for step, keys in sorted(self._steps.get(rank, {}).items())}

    def holds(self, sample_ids: Sequence[str]) -> set[str]:
        return self._holds(sample_ids)
