"""What the Redis engine makes of a request's arguments and the server's replies: the ids of a dead-letter
request, the pending gauge from the counters, a refused put's error."""

from __future__ import annotations

from collections.abc import Iterable

from featurestream.backends.redis import functions
from featurestream.backends.redis.link import reply_text
from featurestream.common import errors
from featurestream.common.refs import SampleRef

__all__ = ["pending_gauge", "refusal", "requeue_refusal", "sample_ids_of"]


def sample_ids_of(sample_ids: Iterable[str] | None) -> list[str]:
    """The ids of a dead-letter request (``None``: all, sent as no ids); ``TypeError`` for anything but strs."""
    if sample_ids is None:
        return []
    if isinstance(sample_ids, (str, bytes)):
        kind = type(sample_ids).__name__
        raise TypeError(f"sample_ids must be a list of ids or None, got the single {kind} {sample_ids!r}")
    ids = list(sample_ids)
    for sample_id in ids:
        if not isinstance(sample_id, str):
            raise TypeError(f"sample ids must be str, got {sample_id!r}")
    if not ids:
        raise ValueError("sample_ids is empty: pass None for every dead letter, or name at least one")
    if len(ids) > functions.MAX_BATCH:
        raise ValueError(f"sample_ids must hold at most {functions.MAX_BATCH} items (one server call), got {len(ids)}")
    return ids


def pending_gauge(values: dict[str, int]) -> int:
    """The pending gauge from the counters (``functions.PENDING_TERMS``, as traced calls derive it on the server)."""
    return sum(sign * values.get(name, 0) for name, sign in functions.PENDING_TERMS.items())


def refusal(status: str, ref: SampleRef, outcome: object) -> Exception:
    """``put``'s error for a refusal the server reported (which names no state for a held id)."""
    return errors.put_refused(status, ref.sample_id, "" if status == "held" else reply_text(outcome))


def requeue_refusal(status: str, sample_id: str, queue: str, keep_cap: int) -> Exception:
    """``requeue_dead_letters``' error for a refusal the server reported about ``sample_id``."""
    if status == "unknown":
        return errors.NotDeadLetter(sample_id, "requeued", queue)
    if status == "gone":
        return errors.DeadLetterNotKept(sample_id, keep_cap)
    if status == "held":
        return errors.DeadLetterQueued(sample_id)
    return errors.QueueDrained(queue)
