"""``AsyncFeaturePipeline``: a background thread running the producer over a prompt source."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType
from typing import Protocol, runtime_checkable

import torch

from featurestream.common.checks import check_seconds
from featurestream.core.protocol import LeaseQueue
from featurestream.pipeline.producer import FeatureProducer

__all__ = ["AsyncFeaturePipeline", "Prompt", "PromptSource", "close_failed", "prompt_kwargs"]

logger = logging.getLogger(__name__)

Prompt = torch.Tensor | tuple[torch.Tensor, ...] | Mapping[str, torch.Tensor]


@runtime_checkable
class PromptSource(Protocol):
    """A polled prompt source: a zero-argument callable returning the next prompt, or ``None`` when (for now) empty.

    A prompt is a bare ``input_ids`` tensor (masks of ones), a 3-tuple
    ``(input_ids, attention_mask, loss_mask)`` or 6-tuple (``+ position_ids,
    seq_lens, doc_remaining``) of long tensors, or a dict of those names (the
    README's ``{"input_ids": ..., "attention_mask": ..., "loss_mask": ...}``;
    ``input_ids`` required, masks of ones for those left out).
    ``AsyncFeaturePipeline`` also takes a plain iterable of prompts instead.
    """

    def __call__(self) -> Prompt | None: ...


_PROMPT_FIELDS = ("input_ids", "attention_mask", "loss_mask", "position_ids", "seq_lens", "doc_remaining")


def prompt_kwargs(prompt: Prompt) -> dict[str, torch.Tensor]:
    """``produce`` keywords for a bare ``input_ids`` tensor, a 3- or 6-tuple of long tensors, or a dict of the
    ``produce`` keywords (``input_ids`` required; an absent mask is ones)."""
    if isinstance(prompt, Mapping):
        return _mapping_kwargs(prompt)
    if isinstance(prompt, torch.Tensor):
        return _mapping_kwargs({"input_ids": prompt})
    if not isinstance(prompt, tuple) or len(prompt) not in (3, 6):
        raise TypeError(
            "prompt iterator must yield an input_ids tensor, a 3-tuple (input_ids, attention_mask, loss_mask), a "
            "6-tuple (+ position_ids, seq_lens, doc_remaining) or a dict of those names, got "
            f"{type(prompt).__name__}" + (f" of length {len(prompt)}" if isinstance(prompt, tuple) else "")
        )
    return dict(zip(_PROMPT_FIELDS, prompt, strict=False))


def _mapping_kwargs(prompt: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A dict prompt's ``produce`` keywords: its own, and masks of ones for those it leaves out."""
    unknown = sorted(str(name) for name in prompt if name not in _PROMPT_FIELDS)
    if unknown or "input_ids" not in prompt:
        raise TypeError(
            f"a dict prompt needs input_ids and takes only {', '.join(_PROMPT_FIELDS)}; "
            f"got keys {sorted(map(str, prompt))!r}" + (f" ({', '.join(unknown)} not among them)" if unknown else "")
        )
    kwargs = dict(prompt)
    for mask in ("attention_mask", "loss_mask"):
        if mask not in kwargs and isinstance(kwargs["input_ids"], torch.Tensor):
            kwargs[mask] = torch.ones_like(kwargs["input_ids"])
    return kwargs


def close_failed(queue: LeaseQueue, who: str, error: BaseException) -> None:
    """A producer ended by ``error``: close ``queue`` with it as the cause (``LeaseQueue.close``), so its
    consumers in every process learn it (the loader raises ``ProducerFailed``) instead of waiting for samples
    that will never come. A queue that cannot take the cause (a reference-era one) is closed plainly; a close
    that fails is logged (the producer's own error is what its caller sees)."""
    cause = f"{who} (pid {os.getpid()} on {socket.gethostname()}) failed: {type(error).__name__}: {error}"
    try:
        try:
            queue.close(cause=cause)
        except TypeError:  # a close() without cause=: the consumers still stop, at the drain
            queue.close()
    except Exception:
        logger.exception("closing the queue after %s could not record the failure", who)


class AsyncFeaturePipeline:
    """Produce on a background thread and enqueue with backpressure.

    ``prompt_source`` is a zero-arg callable returning a prompt, or ``None``
    when (for now) exhausted, or an iterable of prompts; a prompt is a bare
    ``input_ids`` tensor (masks of ones), a 3- or 6-tuple of long tensors or a
    dict of those names (``PromptSource``).
    Each produced ref is enqueued with ``queue.put_blocks_until_below(...,
    abort_when=<stop requested>)``; a ref whose put was aborted or refused is
    discarded from the store, never orphaned.

    With ``stop_on_exhausted`` the thread ends when the source is exhausted;
    otherwise a callable source is polled every ``poll_interval`` seconds
    until ``stop()``. The thread closes the queue when it ends (so consumers
    drain and stop), which makes the pipeline single-use: ``start()`` is
    idempotent while running and refused afterwards. ``stop()`` re-raises the
    thread's error; an error that ends the thread also closes the queue with
    it as the cause (``close_failed``), so the loaders on the queue, in every
    process, raise ``ProducerFailed`` naming it instead of waiting.
    """

    def __init__(
        self,
        producer: FeatureProducer,
        queue: LeaseQueue,
        prompt_source: PromptSource | Iterable[Prompt],
        *,
        poll_interval: float = 0.1,
        stop_on_exhausted: bool = True,
    ) -> None:
        check_seconds("poll_interval", poll_interval)
        if not isinstance(prompt_source, (PromptSource, Iterable)):
            raise TypeError(f"prompt_source must be a callable or an iterable, got {type(prompt_source).__name__}")
        self.producer = producer
        self.queue = queue
        self.poll_interval = poll_interval
        self.stop_on_exhausted = stop_on_exhausted
        self._source = prompt_source
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.produced = 0

    def stop_requested(self) -> bool:
        """Whether ``stop()`` was called (the ``abort_when`` of every put)."""
        return self._stop.is_set()

    @property
    def is_running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def start(self) -> AsyncFeaturePipeline:
        """Start the producer thread; a no-op while it runs, ``RuntimeError`` once it has ended."""
        with self._lock:
            if self._thread is not None:
                if self._thread.is_alive():
                    return self
                raise RuntimeError(
                    "AsyncFeaturePipeline is single-use: its thread has ended and closed the queue; build a new one"
                )
            self._thread = threading.Thread(target=self._run, name="featurestream-producer", daemon=True)
            self._thread.start()
        return self

    def stop(self, *, join_timeout: float | None = 10.0) -> None:
        """Ask the thread to stop (unblocking a paused put), wait for it, and re-raise its error, if any.

        Waits up to ``join_timeout`` seconds (``None``: without limit); ``TimeoutError`` if the thread is still
        running then (stuck in a forward), with the stop request left in place.
        """
        if join_timeout is not None:
            check_seconds("join_timeout", join_timeout)
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(join_timeout)
            if thread.is_alive():
                raise TimeoutError(f"the producer thread did not stop within {join_timeout} s (stuck in a forward?)")
        self._raise_error()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end (the source exhausted or ``stop()``); does not raise its error."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _raise_error(self) -> None:
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def __enter__(self) -> AsyncFeaturePipeline:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- the thread --------------------------------------------------------------
    def _run(self) -> None:
        error: BaseException | None = None
        try:
            for prompt in self._prompts():
                ref = self.producer.produce(**prompt_kwargs(prompt))
                try:
                    self.queue.put_blocks_until_below(ref, abort_when=self.stop_requested)
                except BaseException as exc:
                    self.producer.discard(ref)
                    if isinstance(exc, RuntimeError) and (self._stop.is_set() or self.queue.is_closed):
                        return  # the put was aborted by stop() (or someone closed the queue): not an error
                    raise
                self.produced += 1
        except BaseException as exc:
            logger.exception("the producer thread failed; stop() re-raises the error")
            error = exc
            with self._lock:
                self._error = exc
        finally:
            if error is None:
                self.queue.close()
            else:
                close_failed(self.queue, f"AsyncFeaturePipeline of run {self.producer.run_id!r}", error)

    def _prompts(self) -> Iterator[Prompt]:
        if not callable(self._source):
            for prompt in self._source:
                if self._stop.is_set():
                    return
                yield prompt
            if not self.stop_on_exhausted:
                self._stop.wait()  # keep the queue open until stop(), as a polled source would
            return
        while not self._stop.is_set():
            prompt = self._source()
            if prompt is not None:
                yield prompt
            elif self.stop_on_exhausted or self._stop.wait(self.poll_interval):
                return
