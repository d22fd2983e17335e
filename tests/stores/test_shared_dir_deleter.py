"""SharedDirFeatureStore frees a removed sample's bytes off the caller's thread, and never leaks them."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from featurestream import SharedDirFeatureStore
from featurestream.stores import deleter, shared_dir
from featurestream.stores.arena import entries
from support.helpers import put_eagle3


def scrubbed(directory: Path) -> list[str]:
    return [name for name in os.listdir(directory) if name.startswith(shared_dir.SCRUBBED_PREFIX)]


def on_scrubbed_unlink(monkeypatch: pytest.MonkeyPatch, hook: Callable[[str], None]) -> None:
    """Make the deleter call ``hook(path)`` before it unlinks a scrubbed file (``hook`` may raise instead)."""
    real_unlink = os.unlink

    def unlink(path: str) -> None:
        if os.path.basename(path).startswith(shared_dir.SCRUBBED_PREFIX):
            hook(path)
        real_unlink(path)

    monkeypatch.setattr(deleter.os, "unlink", unlink)


def test_scrub_removes_the_name_at_once_and_unlinks_the_bytes_off_the_calling_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unlinked_on: list[str] = []
    on_scrubbed_unlink(monkeypatch, lambda _: unlinked_on.append(threading.current_thread().name))
    store = SharedDirFeatureStore(tmp_path, pool=False)  # an arena's file keeps its pages: its name goes at once
    ref = put_eagle3(store, 1)
    store.retain(ref)
    store.scrub(ref)
    assert not os.path.exists(store.data_path(ref)), "the sample's name is gone when scrub returns"
    with pytest.raises(KeyError, match="s1"):
        store.get(ref)
    store.close()  # waits for the deleter
    assert entries(tmp_path) == []
    assert unlinked_on == ["featurestream-deleter"]


@pytest.mark.parametrize("pool", [True, False], ids=["slot", "file"])
def test_scrub_moves_the_data_file_once_and_spares_a_file_written_since(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: bool
) -> None:
    """The ledger's part of scrub drops the marker only: the data file was removed already (a slot's name
    unlinked, a file of its own moved out), and a second attempt could only take a file another instance wrote
    under that name since."""
    store = SharedDirFeatureStore(tmp_path, pool=pool)
    ref = put_eagle3(store, 1)
    store.retain(ref)
    data = store.data_path(ref)
    removed: list[str] = []
    real_rename, real_unlink = os.rename, os.unlink

    def then_rewrite(path: str) -> None:
        if path == data:
            removed.append(path)
            if len(removed) == 1:  # another writer's file under the same name, between the two steps of scrub
                Path(path).write_bytes(b"another instance's sample")

    def rename(source: str, target: str) -> None:
        real_rename(source, target)
        then_rewrite(source)

    def unlink(path: str) -> None:
        real_unlink(path)
        then_rewrite(path)

    monkeypatch.setattr(shared_dir.os, "rename", rename)
    monkeypatch.setattr(shared_dir.os, "unlink", unlink)
    store.scrub(ref)
    monkeypatch.undo()
    assert removed == [data]
    assert Path(data).read_bytes() == b"another instance's sample"
    assert not os.path.exists(store._marker_path(ref))
    store.close()


def test_a_failed_background_unlink_is_retried_by_gc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failures = [OSError(errno.EIO, "I/O error")]

    def fail_once(_: str) -> None:
        if failures:
            raise failures.pop()

    on_scrubbed_unlink(monkeypatch, fail_once)
    store = SharedDirFeatureStore(tmp_path, pool=False)  # a file of its own: its bytes go in the background
    ref = put_eagle3(store, 1)
    store.retain(ref)
    store.scrub(ref)
    store._deleter.flush()
    assert len(scrubbed(tmp_path)) == 1, "the failed unlink leaves the removed file, remembered for a retry"
    assert store.gc() == 1
    assert entries(tmp_path) == []


def test_a_new_instance_unlinks_what_a_dead_process_left_removed(tmp_path: Path) -> None:
    left = tmp_path / f"{shared_dir.SCRUBBED_PREFIX}0123456789abcdef"
    left.write_bytes(b"\0" * 1024)
    store = SharedDirFeatureStore(tmp_path)
    store.close()
    assert entries(tmp_path) == []


def test_a_process_that_exits_without_closing_its_store_leaves_nothing(tmp_path: Path) -> None:
    # Each unlink takes 20 ms, so the daemon worker is still busy when the interpreter exits.
    script = (
        "import sys, time\n"
        "from featurestream import SharedDirFeatureStore\n"
        "from featurestream.stores.deleter import BackgroundDeleter\n"
        "unlink = BackgroundDeleter._unlink\n"
        "BackgroundDeleter._unlink = lambda self, path: (time.sleep(0.02), unlink(self, path))\n"
        "from featurestream.testing import sample_tensors\n"
        "store = SharedDirFeatureStore(sys.argv[1])\n"
        "refs = [store.put(f's{i}', sample_tensors(i, 4096)) for i in range(20)]\n"
        "for ref in refs:\n"
        "    store.retain(ref)\n"
        "    store.scrub(ref)\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, timeout=120)
    assert entries(tmp_path) == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_scrubs_with_its_own_deleter(tmp_path: Path) -> None:
    store = SharedDirFeatureStore(tmp_path)
    first, second = put_eagle3(store, 1), put_eagle3(store, 2)
    for ref in (first, second):
        store.retain(ref)
    store.scrub(first)
    store._deleter.flush()  # the parent's worker is alive (idle) when it forks; the child has none
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(30)  # a child waiting on the parent's worker would hang: fail it instead
            store.scrub(second)
            deadline = time.monotonic() + 10
            while scrubbed(tmp_path) and time.monotonic() < deadline:  # no flush: a worker must run here
                time.sleep(0.01)
            code = 0 if scrubbed(tmp_path) == [] else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    store.close()
    assert entries(tmp_path) == []


def test_the_worker_outlives_an_error_hook_that_raises(tmp_path: Path) -> None:
    def broken_hook(path: str, exc: OSError) -> None:
        raise RuntimeError("the hook itself fails")

    removed = tmp_path / "removed"
    removed.mkdir()  # unlink of a directory raises IsADirectoryError: the hook runs, and raises
    unlinked = tmp_path / "file"
    unlinked.write_bytes(b"x")
    background = deleter.BackgroundDeleter(broken_hook)
    background.submit(str(removed))
    background.submit(str(unlinked))
    flushing = threading.Thread(target=background.flush, daemon=True)
    flushing.start()
    flushing.join(timeout=10)
    assert not flushing.is_alive(), "flush hangs: the worker died with the hook's error"
    assert not unlinked.exists()
