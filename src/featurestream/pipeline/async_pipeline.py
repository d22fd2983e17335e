"""``AsyncFeaturePipeline``: a background thread running the producer over a prompt source."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Protocol, runtime_checkable

import torch

from featurestream.common.checks import check_seconds
from featurestream.core.protocol import LeaseQueue
from featurestream.pipeline.producer import FeatureProducer

__all__ = ["AsyncFeaturePipeline", "Prompt", "PromptSource", "prompt_kwargs"]

logger = logging.getLogger(__name__)

Prompt = torch.Tensor | tuple[torch.Tensor, ...]


@runtime_checkable
class PromptSource(Protocol):
    """A polled prompt source: a zero-argument callable returning the next prompt, or ``None`` when (for now) empty.

    A prompt is a bare ``input_ids`` tensor (masks of ones) or a 3-tuple
    ``(input_ids, attention_mask, loss_mask)`` or 6-tuple (``+ position_ids,
    seq_lens, doc_remaining``) of long tensors. ``AsyncFeaturePipeline`` also
    takes a plain iterable of prompts instead.
    """

    def __call__(self) -> Prompt | None: ...


_PROMPT_FIELDS = ("input_ids", "attention_mask", "loss_mask", "position_ids", "seq_lens", "doc_remaining")


def prompt_kwargs(prompt: Prompt) -> dict[str, torch.Tensor]:
    """``produce`` keywords for a bare ``input_ids`` tensor or a 3- or 6-tuple of long tensors."""
    if isinstance(prompt, torch.Tensor):
        ones = torch.ones_like(prompt)
        return {"input_ids": prompt, "attention_mask": ones, "loss_mask": ones.clone()}
    if not isinstance(prompt, tuple) or len(prompt) not in (3, 6):
        raise TypeError(
            "prompt iterator must yield an input_ids tensor, a 3-tuple (input_ids, attention_mask, loss_mask) or a "
            f"6-tuple (+ position_ids, seq_lens, doc_remaining), got {type(prompt).__name__}"
            + (f" of length {len(prompt)}" if isinstance(prompt, tuple) else "")
        )
    return dict(zip(_PROMPT_FIELDS, prompt, strict=False))


class AsyncFeaturePipeline:
    """Produce on a background thread and enqueue with backpressure.

    ``prompt_source`` is a zero-arg callable returning a prompt, or ``None``
    when (for now) exhausted, or an iterable of prompts; a prompt is a bare
    ``input_ids`` tensor (masks of ones) or a 3- or 6-tuple of long tensors.
    Each produced ref is enqueued with ``queue.put_blocks_until_below(...,
    abort_when=<stop requested>)``; a ref whose put was aborted or refused is
    discarded from the store, never orphaned.

    With ``stop_on_exhausted`` the thread ends when the source is exhausted;
    otherwise a callable source is polled every ``poll_interval`` seconds
    until ``stop()``. The thread closes the queue when it ends (so consumers
    drain and stop), which makes the pipeline single-use: ``start()`` is
    idempotent while running and refused afterwards. ``stop()`` re-raises the
    thread's error.
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
            with self._lock:
                self._error = exc
        finally:
            self.queue.close()

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
