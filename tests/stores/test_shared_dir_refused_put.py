"""A put the queue refuses because the shared-dir store could not write its queued marker leaves no trace.

After the refusal and the producer's last release, neither ``is_resident`` (of this instance or another on the
directory) nor ``health()`` counts the sample, and its data file and ``<id>.safetensors`` link are gone.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from featurestream import SampleRefQueue, SharedDirFeatureStore
from featurestream.common.refs import SampleRef
from featurestream.stores import shared_dir
from support.helpers import put_eagle3


def directory_in_the_way(store: SharedDirFeatureStore, ref: SampleRef, monkeypatch: pytest.MonkeyPatch) -> None:
    os.mkdir(store._marker_path(ref))  # the marker can neither be created nor unlinked


def create_refused(store: SharedDirFeatureStore, ref: SampleRef, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open

    def refusing(path: str, *args: int) -> int:
        if path == store._marker_path(ref):
            raise OSError(errno.EIO, "Input/output error", path)
        return real_open(path, *args)

    monkeypatch.setattr(shared_dir.os, "open", refusing)


@pytest.mark.parametrize("fault", [directory_in_the_way, create_refused])
def test_after_the_refusal_and_the_last_release_nothing_counts_the_sample(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fault: Callable[[SharedDirFeatureStore, SampleRef, pytest.MonkeyPatch], None],
) -> None:
    store, other = SharedDirFeatureStore(tmp_path), SharedDirFeatureStore(tmp_path)
    ref = put_eagle3(store, 1)
    _, handle = store.get(ref)
    fault(store, ref, monkeypatch)
    queue = SampleRefQueue(store)
    with caplog.at_level(logging.CRITICAL), pytest.raises(OSError, match="put of sample 's1' refused"):
        queue.put(ref)
    monkeypatch.undo()
    assert queue.pending_count() == 0
    assert store.is_resident("s1") and store.health().sample_count == 1, "the producer's handle still holds it"
    store.release(handle)
    store._deleter.flush()
    assert not store.is_resident("s1") and not other.is_resident("s1")
    assert store.health().resident_bytes == 0 and store.health().sample_count == 0
    assert not any(name.endswith(".safetensors") for name in os.listdir(tmp_path))
