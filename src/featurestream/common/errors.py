"""The errors every queue backend raises, each defined once with its message built once.

Each subclasses ``FeatureStreamError`` (catch it for anything featurestream refuses on purpose) and the builtin a
caller already catches (``RuntimeError``, ``ValueError``, ``LookupError``), so code written against those keeps
working; code that needs to tell them apart catches the type, never the text. Every one is exported from the
package root (``from featurestream import QueueClosed``).
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "DeadLetterNotKept",
    "DeadLetterQueued",
    "DuplicateSample",
    "FeatureStreamError",
    "IllegalTransition",
    "KeptDeadLetter",
    "LeaseLost",
    "NotALease",
    "NotDeadLetter",
    "NotResident",
    "ProducerFailed",
    "QueueInUse",
    "PutAborted",
    "QueueClosed",
    "QueueDrained",
    "RepeatedInBatch",
    "ScrubOwed",
    "SettledSample",
    "StoreMismatch",
    "TensorInRef",
    "put_refused",
    "store_error",
]


class FeatureStreamError(Exception):
    """The base of every error featurestream raises on purpose: a refused call, a lost or corrupt sample.

    Never raised itself: each concrete type also subclasses the builtin recipes catch (``LeaseLost`` is a
    ``RuntimeError``, ``SampleLostError`` a ``KeyError`` ...). ``IllegalTransition`` is deliberately not one: it
    reports a defect of the queue, which no ``except FeatureStreamError`` around a queue call may hide.
    """


class _Pickled:
    """Pickles as what was raised: the constructors take the facts, not the message ``args`` holds."""

    def __reduce__(self) -> tuple[object, ...]:
        return _rebuild, (type(self), self.args, dict(vars(self)))


def _rebuild(cls: type[BaseException], args: tuple[object, ...], state: dict[str, object]) -> BaseException:
    error = cls.__new__(cls)
    error.args = args
    vars(error).update(state)
    return error


class _Built(_Pickled, FeatureStreamError):
    """A featurestream error that pickles as raised."""


class _Said(_Built):
    """An error whose text is the class's ``says`` with the facts it was raised with filled in (``str.format`` by
    name); each fact is also an attribute of the error."""

    says: ClassVar[str]

    def __init__(self, **facts: object) -> None:
        super().__init__(self.says.format(**facts))
        vars(self).update(facts)


class _SampleError(_Said):
    """An error about one sample, built from its id alone."""

    def __init__(self, sample_id: str) -> None:
        super().__init__(sample_id=sample_id)


class QueueClosed(_SampleError, RuntimeError):
    """A put into a closed queue: nothing was enqueued."""

    says = "cannot put sample {sample_id!r}: the queue is closed"


class PutAborted(_SampleError, RuntimeError):
    """``put_blocks_until_below`` gave up because its ``abort_when()`` said so: nothing was enqueued."""

    says = "put of sample {sample_id!r} aborted: abort_when() returned True"


class ProducerFailed(_Said, RuntimeError):
    """The queue was closed by a producer that failed (``close(cause=...)``, in any process): the loader raises it
    where its stream would have ended."""

    says = (
        "the queue was closed by a producer that failed: {cause}. The samples it queued before the failure were "
        "handed out; fix the producer and start the run again"
    )

    def __init__(self, cause: str) -> None:
        super().__init__(cause=cause)


class QueueInUse(_Said, RuntimeError):
    """A delete of a queue that is open or holds live leases, without ``force``: nothing was deleted."""

    says = (
        "queue {name!r} is {why}: not deleted (a producer or consumer may still use it; close it and let it "
        "drain, or force the delete: its producers' and consumers' next calls then fail)"
    )

    def __init__(self, name: str, why: str) -> None:
        super().__init__(name=name, why=why)


class DuplicateSample(_Built, ValueError):
    """A put of an id the queue holds (pending or leased)."""

    def __init__(self, sample_id: str, state: str | None = None) -> None:
        where = f"already queued ({state})" if state else "already queued"
        super().__init__(f"sample {sample_id!r} is already present: it is {where}; ids must be unique")
        self.sample_id = sample_id


class RepeatedInBatch(_SampleError, ValueError):
    """A ``put_many`` naming one id twice: the batch is refused as a whole."""

    says = "sample {sample_id!r} appears twice in one put_many; ids must be unique"


class SettledSample(_Said, ValueError):
    """A re-put of a sample the dedup window remembers as settled (``outcome``: acked or dead-lettered)."""

    says = (
        "sample {sample_id!r} was already {outcome}; re-puts of settled samples are refused "
        "(discard the duplicate from the store)"
    )

    def __init__(self, sample_id: str, outcome: str) -> None:
        super().__init__(sample_id=sample_id, outcome=outcome)


class ScrubOwed(_SampleError, ValueError):
    """A re-put of a settled sample whose scrub the queue still owes its store."""

    says = "sample {sample_id!r} was settled and the store still has to scrub it; re-puts are refused"


class KeptDeadLetter(_SampleError, ValueError):
    """A put of a dead letter's id whose bytes are kept for a requeue."""

    says = (
        "sample {sample_id!r} is a dead letter whose bytes are kept (keep_dead_letter_bytes); "
        "requeue_dead_letters or purge_dead_letters it instead of re-putting"
    )


class LeaseLost(_Built, RuntimeError):
    """The lease is no longer live (acked, failed, reclaimed, or never issued here)."""

    def __init__(self, lease: object) -> None:
        lease_id = getattr(lease, "lease_id", lease)
        sample_id = getattr(getattr(lease, "ref", None), "sample_id", None)
        super().__init__(
            f"lease {lease_id!r} of sample {sample_id!r} is not live; stop working on it (it was settled or reclaimed)"
        )
        self.lease_id = lease_id
        self.sample_id = sample_id


class NotALease(_Built, TypeError):
    """``ack`` / ``fail`` / ``extend`` (or a batch of them) got something that is no ``Lease``: a programming error,
    unlike a stale lease (a real ``Lease`` the queue no longer honours). Nothing was settled."""

    def __init__(self, action: str, value: object) -> None:
        super().__init__(f"{action} expects a Lease returned by acquire, got {type(value).__name__}: {value!r:.80}")
        self.action = action
        self.value_type = type(value).__name__


class NotResident(_Said, ValueError):
    """A put of a ref whose bytes its store no longer holds: a consumer could never get it. Nothing was enqueued."""

    says = (
        "sample {sample_id!r} is not resident in {store_uri}: its bytes were released or scrubbed before the "
        "put, so a consumer could never get it; nothing enqueued (store it again)"
    )

    def __init__(self, sample_id: str, store_uri: str) -> None:
        super().__init__(sample_id=sample_id, store_uri=store_uri)


class TensorInRef(_Said, TypeError):
    """A ref that carries a tensor (``where``: the path and type found) cannot travel in the control plane."""

    says = "sample {sample_id!r} cannot travel as a ref: {where}"

    def __init__(self, sample_id: object, where: str) -> None:
        super().__init__(sample_id=sample_id, where=where)


class StoreMismatch(_Said, ValueError):
    """A queue instance bound to a store other than the one the queue is pinned to (its first instance's): its
    consumers could not read the samples the others put, nor the others read its own. Nothing was changed."""

    says = (
        "queue {queue!r} is bound to the store {pinned} (pinned by its first instance), but this instance's "
        "store is {store_uri}: every instance of a queue must use the same store (or use another queue name)"
    )

    def __init__(self, queue: str, pinned: str, store_uri: str) -> None:
        super().__init__(queue=queue, pinned=pinned, store_uri=store_uri)


class NotDeadLetter(_Built, LookupError):
    """A dead-letter repair naming an id that is no dead letter: nothing was done."""

    def __init__(self, sample_id: str, done: str, queue: str | None = None) -> None:
        of = f"queue {queue!r}" if queue is not None else "this queue"
        super().__init__(f"sample {sample_id!r} is not a dead letter of {of}; nothing {done}")
        self.sample_id = sample_id


class DeadLetterNotKept(_Built, ValueError):
    """A requeue of a dead letter whose bytes were scrubbed: nothing was requeued."""

    def __init__(self, sample_id: str, keep_dead_letter_bytes: int) -> None:
        super().__init__(
            f"dead letter {sample_id!r} cannot be requeued: its bytes were not kept (keep_dead_letter_bytes="
            f"{keep_dead_letter_bytes}, or over that cap when it died); nothing requeued (purge it instead)"
        )
        self.sample_id = sample_id


class DeadLetterQueued(_SampleError, ValueError):
    """A requeue of a dead letter whose id is queued again: nothing was requeued."""

    says = "sample {sample_id!r} is queued again already; nothing requeued"


class QueueDrained(_Built, ValueError):
    """A requeue into a drained queue: nothing was requeued."""

    def __init__(self, queue: str | None = None) -> None:
        which = f"queue {queue!r}" if queue is not None else "the queue"
        super().__init__(f"{which} is drained: nothing can be requeued into it")


class IllegalTransition(_Pickled, AssertionError):
    """A state machine was asked for a transition its table does not allow: a coordinator defect, never user error.

    An ``AssertionError`` so that no recipe catching ``RuntimeError`` / ``ValueError`` hides it.
    """

    def __init__(self, machine: str, subject: str, state: str, trigger: str) -> None:
        super().__init__(f"{machine} machine: {subject} is {state!r}, which has no {trigger!r} transition")
        self.machine = machine
        self.subject = subject
        self.state = state
        self.trigger = trigger


def put_refused(why: str, sample_id: str, detail: str = "") -> QueueClosed | ValueError:
    """The error of a put an engine refuses, by why: ``closed`` (``QueueClosed``), ``held`` (``DuplicateSample``;
    ``detail``: the state it is in, when known), ``kept`` (``KeptDeadLetter``), otherwise a settled sample the
    dedup window remembers (``SettledSample``; ``detail``: acked or dead-lettered). Every engine maps its refusals
    here, so a refused put reads the same on every backend."""
    if why == "closed":
        return QueueClosed(sample_id)
    if why == "held":
        return DuplicateSample(sample_id, detail or None)
    if why == "kept":
        return KeptDeadLetter(sample_id)
    return SettledSample(sample_id, detail)


def store_error(exc: Exception, doing: str) -> Exception:
    """An exception of ``exc``'s type whose message says what the queue was doing (raise it ``from exc``).

    Keeps the type callers catch (``OSError`` and its errno, ...); falls back to ``RuntimeError``
    for an exception type that cannot be built from a message.
    """
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc)
        args: tuple[object, ...] = (
            (exc.errno, f"{doing}: the store raised {reason}")
            if exc.errno
            else (f"{doing}: the store raised {reason}",)
        )
    else:
        args = (f"{doing}: the store raised {type(exc).__name__}: {exc}",)
    try:
        return type(exc)(*args)
    except Exception:
        return RuntimeError(*args[-1:])
