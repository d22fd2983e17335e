"""``MachineConfig``: the bounds of the stateful test, and the kit's fixed limits."""

from __future__ import annotations

import dataclasses
import math

from featurestream.core.lease import VisibilityTimeout

__all__ = ["BOUND", "CALLBACK_MODES", "MachineConfig"]

CALLBACK_MODES = ("record", "raise", "reenter")
BOUND = 10.0  # the default MachineConfig.bound


@dataclasses.dataclass(frozen=True)
class MachineConfig:
    """Bounds of the stateful test (small on purpose: bugs live in interleavings, not in sizes).

    Sample ``i`` is ``sample_tensors(i)`` (40 * (i + 1) bytes); the watermarks are
    in bytes and passed to the queue as ``high_watermark_bytes``/``low_watermark_bytes``.
    ``producers`` bounds the blocked puts in flight at once (each on its own
    thread); a woken blocked put gets ``producer_rounds`` rounds to enqueue or
    give up once the queue lets it (the bounded-progress check).
    ``store_faults=False`` keeps the store healthy (for traces of a spec
    without faults). ``store_losses`` bounds how many queued samples the store
    may lose in one run (the spec's ``MaxLosses``; 0 for traces, whose spec
    has no lost bytes). ``failovers`` bounds the primary's losses in one run
    of a backend that declares them (each one costs seconds). ``untrainable``
    is how many samples (the last ones) the consumers' schema refuses: they
    reject them (``queue.reject``) and never ack them. ``bound`` is how
    many seconds a producer round or a re-entrant callback gets before the
    kit calls it a hang (an invariant fails, the suite does not hang): a
    replicated backend's call can wait out a whole failover, and a sentinel
    on a busy machine may start one of its own. ``give_backs=True`` lets a
    consumer hand every lease it holds back unused (``give_back_many``, as a
    loader closing with prefetched leases does: the spec's ``GiveBack``).
    """

    samples: int = 4
    consumers: int = 2
    max_deliveries: int = 2
    visibility_timeout: float = 10.0
    high_watermark_bytes: int = 200
    low_watermark_bytes: int = 80
    dedup_window: int = 1000
    sample_tokens: int | None = None  # every sample this many tokens (one size, as trace validation needs)
    producers: int = 2
    producer_rounds: int = 3
    store_faults: bool = True
    store_losses: int = 1
    failovers: int = 1
    untrainable: int = 0
    bound: float = BOUND
    give_backs: bool = False

    def __post_init__(self) -> None:
        for name in ("samples", "consumers", "max_deliveries", "dedup_window", "producers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MachineConfig.{name} must be an int >= 1, got {value!r}")
        for name in ("store_losses", "failovers", "untrainable"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"MachineConfig.{name} must be an int >= 0, got {value!r}")
        if self.untrainable > self.samples:
            raise ValueError(f"MachineConfig.untrainable must be <= samples={self.samples}, got {self.untrainable!r}")
        rounds = self.producer_rounds
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 2:
            raise ValueError(f"MachineConfig.producer_rounds must be an int >= 2, got {rounds!r}")
        if isinstance(self.bound, bool) or not isinstance(self.bound, (int, float)) or not 0 < self.bound < math.inf:
            raise ValueError(f"MachineConfig.bound must be a finite number of seconds > 0, got {self.bound!r}")
        VisibilityTimeout(self.visibility_timeout)  # validates
        if not 0 <= self.low_watermark_bytes < self.high_watermark_bytes:
            raise ValueError(
                f"MachineConfig watermarks need 0 <= low < high, got low={self.low_watermark_bytes!r} "
                f"high={self.high_watermark_bytes!r}"
            )

    @property
    def sample_ids(self) -> tuple[str, ...]:
        return tuple(f"s{i}" for i in range(self.samples))

    @property
    def untrainable_ids(self) -> frozenset[str]:
        return frozenset(self.sample_ids[self.samples - self.untrainable :])

    @property
    def consumer_ids(self) -> tuple[str, ...]:
        return tuple(f"c{i}" for i in range(self.consumers))
