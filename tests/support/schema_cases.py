"""Samples put by hand that no EAGLE-3 consumer can train, and what must become of each: dead-lettered by the loader
with reason ``schema`` and never counted as trained. Shared by the in-process and the Redis queue's tests."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

from featurestream import FeatureDataLoader, FeatureStore
from featurestream.monitor.metrics import queue_metrics
from featurestream.monitor.status import snapshot
from support.samples import eagle3_tensors

TOKENS = 4


def _without(name: str) -> dict[str, torch.Tensor]:
    tensors = eagle3_tensors(TOKENS)
    del tensors[name]
    return tensors


def _with(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    return {**eagle3_tensors(TOKENS), name: tensor}


# sample id -> (its tensors, the feature its dead letter names, what the reason says was wrong)
UNTRAINABLE: dict[str, tuple[dict[str, torch.Tensor], str, str]] = {
    "wrong-dtype": (_with("input_ids", torch.zeros(1, TOKENS)), "'input_ids'", "got torch.float32"),
    "wrong-rank": (_with("aux_hidden_states", torch.zeros(1, TOKENS)), "'aux_hidden_states'", "got [1, 4]"),
    "wrong-token-count": (
        _with("loss_mask", torch.ones(1, TOKENS + 1, dtype=torch.long)),
        "'loss_mask'",
        f"S={TOKENS}",
    ),
    "no-supervision": (_without("logits"), "'logits'", "no supervision encoding"),
}
TRAINABLE = ("ok-first", "ok-last")


def put_all(queue: Any, store: FeatureStore, untrainable: list[str]) -> None:
    """A trainable sample, the ``untrainable`` ones, another trainable one: every put taken, as the reference's
    are."""
    ids = [TRAINABLE[0], *untrainable, TRAINABLE[1]]
    for sample_id in ids:
        tensors = UNTRAINABLE[sample_id][0] if sample_id in UNTRAINABLE else eagle3_tensors(TOKENS)
        queue.put(store.put(sample_id, tensors, run_id="run"))
    assert queue.pending_count() == len(ids)


def drain_through_loader(
    queue: Any, store: FeatureStore, expected: type[Exception] = ValueError
) -> tuple[list[str], list[Exception]]:
    """Train until the (closed) queue is drained; the ids trained and the ``expected`` errors the loader raised
    (each at its sample's place in the stream, the loader carrying on), in order."""
    trained: list[str] = []
    raised: list[Exception] = []
    with FeatureDataLoader(queue, store, prefetch=0) as loader:
        while True:
            try:
                next(loader)
            except expected as exc:
                raised.append(exc)
                continue
            except StopIteration:
                break
            assert loader.current_lease is not None
            trained.append(loader.current_lease.ref.sample_id)
    return trained, raised


def check_untrainable_dead_lettered(
    queue: Any, store: FeatureStore, caplog: pytest.LogCaptureFixture, untrainable: list[str]
) -> None:
    """Put the ``untrainable`` samples (``UNTRAINABLE``'s ids) between two good ones, drain through a loader: each
    untrainable one is dead-lettered once, reason ``schema`` naming it, its feature and the fault, logged once,
    counted as dead and never as acked (``stats``, the status snapshot and the metrics agree); the good ones train;
    the store ends empty."""
    put_all(queue, store, untrainable)
    queue.close()
    with caplog.at_level(logging.WARNING, logger="featurestream.pipeline.pull"):
        trained, raised = drain_through_loader(queue, store)
    assert trained == list(TRAINABLE)
    assert [exc.args[0].split("'")[1] for exc in raised] == untrainable
    assert all("dead-lettered (reason schema, never trained)" in str(exc) for exc in raised)
    letters = {letter.ref.sample_id: letter for letter in queue.dead_letters()}
    assert sorted(letters) == sorted(untrainable)
    for sample_id in untrainable:
        _, feature, fault = UNTRAINABLE[sample_id]
        letter = letters[sample_id]
        assert letter.reason.startswith(f"schema: sample {sample_id!r}: eagle3 "), letter.reason
        assert feature in letter.reason and fault in letter.reason, letter.reason
        assert letter.deliveries == 1, "dead at its first delivery, not after max_deliveries"
        logged = [record for record in caplog.records if repr(sample_id) in record.getMessage()]
        assert len(logged) == 1 and "reason schema" in logged[0].getMessage()
    stats = queue.stats()
    bad = len(untrainable)
    assert (stats.acked, stats.dead_lettered, stats.pending, stats.outstanding) == (len(TRAINABLE), bad, 0, 0)
    status = snapshot(queue)
    assert status["counters"]["acked"] == len(TRAINABLE) and status["dead_letters"]["count"] == bad
    assert {entry["sample_id"] for entry in status["dead_letters"]["newest"]} <= set(untrainable)
    metrics = queue_metrics(queue)
    assert metrics["featurestream/acked_total"] == len(TRAINABLE) and metrics["featurestream/dead_letters"] == bad
    assert queue.lifecycle_state == "drained"
    assert store.health().sample_count == 0, "dead letters keep no bytes unless keep_dead_letter_bytes says so"


def check_reject(queue: Any, store: FeatureStore) -> None:
    """``queue.reject`` by hand: dead at once whatever deliveries are left, kept for a requeue as any dead letter
    (``keep_dead_letter_bytes`` on), stale the second time; a ``why`` that is no text is a ``TypeError``."""
    queue.put(store.put("s1", eagle3_tensors(TOKENS), run_id="run"))
    lease = queue.acquire(timeout=1)
    assert lease is not None
    with pytest.raises(TypeError, match="non-empty str"):
        queue.reject(lease, "")
    assert queue.reject(lease, "sample 's1': feature 'x' was wrong") is True
    assert queue.reject(lease, "again") is False
    [letter] = queue.dead_letters()
    assert (letter.reason, letter.deliveries) == ("schema: sample 's1': feature 'x' was wrong", 1)
    stats = queue.stats()
    assert (stats.acked, stats.dead_lettered, stats.pending, stats.outstanding) == (0, 1, 0, 0)
    assert store.is_resident("s1"), "kept: an operator may requeue it once a consumer can train it"
    assert queue.requeue_dead_letters(["s1"]) == ["s1"] and queue.pending_count() == 1
