"""SharedDirFeatureStore: the reference behaviours, queue residency across instances, and I/O failures."""

from __future__ import annotations

import errno
import os
import re
import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from featurestream import (
    CorruptSampleError,
    FeatureDataLoader,
    SampleRefQueue,
    SharedDirFeatureStore,
    VisibilityTimeout,
)
from featurestream.stores import arena, shared_dir
from featurestream.stores.arena import entries, is_slot
from featurestream.testing import FakeClock
from support.helpers import assert_is_sample, eagle3_sample, put_eagle3


def files(directory: Path) -> list[str]:
    """The directory's files, once every removed sample is unlinked (the background deleter's promise).

    Each name's incarnation (``@<32 hex>``, fresh per put) is left out: ``s1@<inc>.safetensors`` reads as
    ``s1.safetensors``. The ``<id>.safetensors`` links are ``pointers``' business; the writers' arena slots
    (``stores.arena``, reused files every data file is a hard link of) are left out too.
    """
    deadline = time.monotonic() + 10
    while any(name.startswith(shared_dir.SCRUBBED_PREFIX) for name in os.listdir(directory)):
        assert time.monotonic() < deadline, f"removed samples never unlinked: {sorted(os.listdir(directory))}"
        time.sleep(0.005)
    names = [name for name in os.listdir(directory) if not os.path.islink(directory / name) and not is_slot(name)]
    return sorted(re.sub(r"@[0-9a-f]{32}(?=\.)", "", name) for name in names)


def pointers(directory: Path) -> dict[str, str]:
    """Each ``<id>.safetensors`` link in ``directory`` -> the file name it holds."""
    return {name: os.readlink(directory / name) for name in os.listdir(directory) if os.path.islink(directory / name)}


def test_put_writes_one_standard_safetensors_file(tmp_path: Path) -> None:
    store = SharedDirFeatureStore(tmp_path / "store")
    assert store.store_uri == f"file://{tmp_path / 'store'}"
    ref = put_eagle3(store, 1)
    assert files(tmp_path / "store") == ["s1.safetensors"]
    assert ref.estimated_bytes == sum(t.numel() * t.element_size() for t in eagle3_sample(1).values())
    with safe_open(store.data_path(ref), framework="pt") as file:
        assert sorted(file.keys()) == sorted(eagle3_sample(1))
        assert torch.equal(file.get_tensor("logits"), eagle3_sample(1)["logits"])
    got, _ = store.get(ref)
    assert_is_sample(got, 1)
    got["logits"].fill_(-1)
    again, _ = store.get(ref)
    assert_is_sample(again, 1)  # what get returns is the caller's to mutate
    assert store.health().resident_bytes == ref.estimated_bytes and store.health().sample_count == 1


def test_reads_files_written_by_the_safetensors_library(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    writer = SharedDirFeatureStore(tmp_path)
    ref = put_eagle3(writer, 2)
    os.unlink(writer.data_path(ref))
    save_file(eagle3_sample(2), writer.data_path(ref))  # its own layout, possibly misaligned
    got, _ = SharedDirFeatureStore(tmp_path).get(ref)
    assert_is_sample(got, 2)


@pytest.mark.parametrize("sample_id", ["a/b", "..", "x..y", "../escape", "nul\0byte"])
def test_ids_that_could_escape_the_directory_are_refused(tmp_path: Path, sample_id: str) -> None:
    store = SharedDirFeatureStore(tmp_path / "store")
    with pytest.raises(ValueError, match=r"may not contain"):
        store.put(sample_id, eagle3_sample(0))
    assert files(tmp_path) == ["store"] and files(tmp_path / "store") == []
    assert store.health().sample_count == 0


def test_an_id_named_like_a_file_on_its_way_out_is_refused_and_a_new_instance_keeps_the_rest(tmp_path: Path) -> None:
    # A new instance deletes every ``.scrubbed-*`` file it finds (left by a process that died mid-scrub): a
    # sample stored under such a name would vanish when the next producer or trainer opens the directory.
    store = SharedDirFeatureStore(tmp_path)
    kept = put_eagle3(store, 1)
    with pytest.raises(ValueError, match=r"sample_id '\.scrubbed-0' may not begin with '\.scrubbed-'"):
        store.put(".scrubbed-0", eagle3_sample(0))
    before = files(tmp_path)
    assert store.health().sample_count == 1 and not [name for name in before if name.startswith(".scrubbed-")]
    got, _ = SharedDirFeatureStore(tmp_path).get(kept)
    assert_is_sample(got, 1)
    assert files(tmp_path) == before


def test_health_is_counters_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SharedDirFeatureStore(tmp_path, max_bytes=10_000, high_watermark_bytes=400, low_watermark_bytes=100)
    refs = [put_eagle3(store, i) for i in range(3)]

    def no_disk(*args: object, **kwargs: object) -> None:
        raise AssertionError("health() touched the disk")

    for name in ("listdir", "scandir", "stat", "lstat"):
        monkeypatch.setattr(os, name, no_disk)
    health = store.health()
    assert health.resident_bytes == sum(r.estimated_bytes for r in refs) and health.sample_count == 3
    assert health.high_watermark_hit and not health.low_watermark_hit and health.capacity_bytes == 10_000


def test_caps_and_config_errors_match_the_local_store(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"both be None"):
        SharedDirFeatureStore(tmp_path, max_samples=None, max_bytes=None)
    with pytest.raises(ValueError, match=r"below"):
        SharedDirFeatureStore(tmp_path, high_watermark_bytes=5, low_watermark_bytes=5)
    store = SharedDirFeatureStore(tmp_path, max_samples=1)
    put_eagle3(store, 0)
    with pytest.raises(MemoryError, match=r"max_samples"):
        put_eagle3(store, 1)
    with pytest.raises(ValueError, match=r"already"):
        put_eagle3(store, 0)
    assert files(tmp_path) == ["s0.safetensors"]
    (tmp_path / "plain-file").write_text("x")
    with pytest.raises(NotADirectoryError, match=r"not a directory"):
        SharedDirFeatureStore(tmp_path / "plain-file")


def test_another_instance_gets_and_releases_and_the_last_release_unlinks(tmp_path: Path) -> None:
    writer, reader = SharedDirFeatureStore(tmp_path), SharedDirFeatureStore(tmp_path)
    ref = put_eagle3(writer, 3)
    first, handle_a = reader.get(ref)
    _, handle_b = reader.get(ref)
    assert_is_sample(first, 3)
    assert reader.health().sample_count == 0, "residency counts only what this instance wrote"
    reader.release(handle_a)
    assert files(tmp_path) == ["s3.safetensors"]
    reader.release(handle_b)
    reader.release(handle_b)  # idempotent
    assert files(tmp_path) == []
    with pytest.raises(KeyError, match=r"not resident"):
        reader.get(ref)
    with pytest.raises(ValueError, match=r"another store"):
        writer.release(handle_a)


def test_unretain_drops_the_marker_so_the_last_release_frees_again(tmp_path: Path) -> None:
    writer, reader = SharedDirFeatureStore(tmp_path), SharedDirFeatureStore(tmp_path)
    ref = put_eagle3(writer, 4)
    writer.retain(ref)
    assert files(tmp_path) == ["s4.retained", "s4.safetensors"]
    writer.unretain(ref)  # the queue refused the put
    assert files(tmp_path) == ["s4.safetensors"]
    reader.release(reader.get(ref)[1])
    assert files(tmp_path) == []


def test_a_second_writer_of_the_same_id_never_clobbers_the_first(tmp_path: Path) -> None:
    """Two instances' puts of one id are two incarnations, two files: each ref reads, frees and scrubs its own."""
    first, second = SharedDirFeatureStore(tmp_path), SharedDirFeatureStore(tmp_path)
    ref = put_eagle3(first, 4)
    other = second.put("s4", eagle3_sample(5))
    assert files(tmp_path) == ["s4.safetensors", "s4.safetensors"]
    assert_is_sample(second.get(ref)[0], 4)
    assert_is_sample(first.get(other)[0], 5)
    second.scrub(other)
    assert files(tmp_path) == ["s4.safetensors"]
    assert_is_sample(second.get(ref)[0], 4)
    with pytest.raises(ValueError, match=r"already in"):  # a forged ref of the same incarnation
        first._write("s4", ref, eagle3_sample(4), take_ownership=False)


def test_is_resident_of_another_instance_s_sample_is_one_stat_of_the_id_s_latest_put(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, other, reader = (SharedDirFeatureStore(tmp_path) for _ in range(3))
    for i in range(50):  # the answer must not depend on how many files the directory holds
        put_eagle3(writer, i)
    first = other.put("x", eagle3_sample(7))
    assert pointers(tmp_path)["x.safetensors"] == os.path.basename(other.data_path(first))

    def no_listing(*args: object, **kwargs: object) -> None:
        raise AssertionError("is_resident listed the directory")

    with monkeypatch.context() as patched:
        for name in ("listdir", "scandir"):
            patched.setattr(os, name, no_listing)
        assert reader.is_resident("x") and reader.is_resident("s49") and not reader.is_resident("nothing")
    other.scrub(first)
    assert not reader.is_resident("x") and "x.safetensors" not in pointers(tmp_path)
    second = other.put("x", eagle3_sample(8))
    reader.scrub(first)  # a stale scrub of the earlier put leaves the new put's link
    assert reader.is_resident("x") and pointers(tmp_path)["x.safetensors"] == os.path.basename(other.data_path(second))
    _, handle = reader.get(second)
    reader.release(handle)  # the last release of an unqueued sample frees it, link and all
    assert not reader.is_resident("x") and "x.safetensors" not in pointers(tmp_path)
    writer.close()
    assert entries(tmp_path) == []


def test_close_unlinks_owned_files_even_with_handles_out(tmp_path: Path) -> None:
    mine, theirs = SharedDirFeatureStore(tmp_path), SharedDirFeatureStore(tmp_path)
    ref = put_eagle3(mine, 0)
    put_eagle3(theirs, 1)
    _, handle = mine.get(ref)
    mine.close()
    mine.close()
    assert files(tmp_path) == ["s1.safetensors"]
    mine.release(handle)  # a handle outliving close is a no-op
    with pytest.raises(RuntimeError, match=r"closed"):
        mine.get(ref)
    with pytest.raises(RuntimeError, match=r"closed"):
        put_eagle3(mine, 2)


def test_a_failed_write_leaves_no_file_and_stores_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SharedDirFeatureStore(tmp_path, pool=False)  # a file of its own per put (the arena's: tests/stores)
    real_write_all = shared_dir.write_all

    def disk_fills_up(fd: int, views: list[memoryview]) -> None:
        real_write_all(fd, views[:2])  # the header and the first tensor fit; the rest does not
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(shared_dir, "write_all", disk_fills_up)
    with pytest.raises(OSError, match=r"disk holding .* is full") as info:
        put_eagle3(store, 0)
    assert info.value.errno == errno.ENOSPC and "s0" in str(info.value)
    assert files(tmp_path) == [] and store.health().sample_count == 0 and not store.is_resident("s0")
    monkeypatch.setattr(shared_dir, "write_all", real_write_all)
    assert_is_sample(store.get(put_eagle3(store, 0))[0], 0)  # the id is free to retry


def test_permission_errors_name_the_sample(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SharedDirFeatureStore(tmp_path, pool=False)
    ref = put_eagle3(store, 0)

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(shared_dir.tempfile, "mkstemp", denied)
    with pytest.raises(PermissionError, match=r"cannot write sample 's1'"):
        put_eagle3(store, 1)
    monkeypatch.setattr(arena, "_open_locked", denied)
    with pytest.raises(PermissionError, match=r"cannot read sample 's0'"):
        store.get(ref)
    assert store.health().sample_count == 1 and files(tmp_path) == ["s0.safetensors"]


def test_a_missing_directory_is_reported_as_such(tmp_path: Path) -> None:
    store = SharedDirFeatureStore(tmp_path / "store")
    ref = put_eagle3(store, 0)
    shutil.rmtree(tmp_path / "store")
    with pytest.raises(FileNotFoundError, match=r"store directory .* is missing"):
        store.get(ref)
    with pytest.raises(FileNotFoundError, match=r"store directory .* is missing"):
        put_eagle3(store, 1)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[: len(data) // 2], id="truncated"),
        pytest.param(lambda data: data[:5], id="no-header"),
        pytest.param(lambda data: data[:8] + b"{not json" + data[17:], id="garbled-header"),
        pytest.param(lambda data: (10**9).to_bytes(8, "little") + data[8:], id="huge-header-length"),
    ],
)
def test_a_corrupt_file_raises_and_its_lease_is_failed_not_lost(tmp_path: Path, damage: object) -> None:
    store = SharedDirFeatureStore(tmp_path)
    clock = FakeClock()
    queue = SampleRefQueue(store, max_deliveries=2, clock=clock)
    ref = put_eagle3(store, 0)
    queue.put(ref)
    path = Path(store.data_path(ref))
    path.write_bytes(damage(path.read_bytes()))  # type: ignore[operator]
    loader = FeatureDataLoader(queue, SharedDirFeatureStore(tmp_path), acquire_poll_interval=0)
    with pytest.raises(CorruptSampleError, match=r"s0"):
        next(loader)
    assert queue.stats().failed == 1 and queue.pending_count() == 1, "the lease was failed, so it is redelivered"
    assert path.exists(), "a failed get must not delete the queued sample"
    with pytest.raises(CorruptSampleError):
        next(loader)
    assert [d.ref.sample_id for d in queue.dead_letters()] == ["s0"]
    assert files(tmp_path) == [], "a dead sample is scrubbed with its marker"


def test_a_file_that_disagrees_with_its_ref_is_corrupt(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    store = SharedDirFeatureStore(tmp_path)
    ref = put_eagle3(store, 0)
    renamed = {("other" if name == "logits" else name): t for name, t in eagle3_sample(0).items()}
    save_file(renamed, store.data_path(ref))
    with pytest.raises(CorruptSampleError, match=r"'logits'.*missing"):
        store.get(ref)
    wrong_shape = eagle3_sample(0, tokens=5)
    save_file(wrong_shape, store.data_path(ref))
    with pytest.raises(RuntimeError, match=r"the ref says"):
        store.get(ref)


class TestQueueResidencyAcrossInstances:
    """The queue lives with the writer; consumers use their own instances (as in other processes)."""

    def setup_queue(self, directory: Path) -> tuple[SharedDirFeatureStore, SampleRefQueue, FakeClock]:
        writer = SharedDirFeatureStore(directory)
        clock = FakeClock()
        return writer, SampleRefQueue(writer, VisibilityTimeout(5.0), clock=clock), clock

    def test_a_stale_release_elsewhere_never_unlinks_a_queued_sample(self, tmp_path: Path) -> None:
        writer, queue, clock = self.setup_queue(tmp_path)
        slow, fresh = SharedDirFeatureStore(tmp_path), SharedDirFeatureStore(tmp_path)
        queue.put(put_eagle3(writer, 0))
        assert files(tmp_path) == ["s0.retained", "s0.safetensors"]
        first = queue.acquire(timeout=0)
        assert first is not None
        _, stale_handle = slow.get(first.ref)
        clock.advance(6.0)
        second = queue.acquire(timeout=0)  # reclaimed and redelivered
        assert second is not None and second.redelivery_count == 1
        slow.release(stale_handle)  # defect A across processes: must not delete the redelivered sample
        got, handle = fresh.get(second.ref)
        assert_is_sample(got, 0)
        fresh.release(handle)
        assert "s0.safetensors" in files(tmp_path)
        queue.ack(second)
        assert files(tmp_path) == [] and writer.health().sample_count == 0

    def test_a_crashed_consumer_leaks_nothing(self, tmp_path: Path) -> None:
        writer, queue, clock = self.setup_queue(tmp_path)
        crashed, survivor = SharedDirFeatureStore(tmp_path), SharedDirFeatureStore(tmp_path)
        queue.put(put_eagle3(writer, 0))
        lease = queue.acquire(timeout=0)
        assert lease is not None
        crashed.get(lease.ref)  # never released: the process died
        clock.advance(6.0)
        again = queue.acquire(timeout=0)
        assert again is not None
        survivor.release(survivor.get(again.ref)[1])
        queue.ack(again)
        assert files(tmp_path) == [] and writer.health().resident_bytes == 0

    def test_a_queue_whose_instance_did_not_write_the_sample_still_scrubs_it(self, tmp_path: Path) -> None:
        writer = SharedDirFeatureStore(tmp_path)
        coordinator = SharedDirFeatureStore(tmp_path)
        queue = SampleRefQueue(coordinator)
        queue.put(put_eagle3(writer, 0))
        lease = queue.acquire(timeout=0)
        assert lease is not None
        reader = SharedDirFeatureStore(tmp_path)
        reader.release(reader.get(lease.ref)[1])
        assert "s0.safetensors" in files(tmp_path), "the marker protects it from the reader's last release"
        queue.ack(lease)
        assert files(tmp_path) == []


def test_a_missing_parent_is_refused_unless_create_and_nothing_is_made(tmp_path: Path) -> None:
    typo = tmp_path / "mnt" / "featurs" / "run-1"
    with pytest.raises(
        FileNotFoundError, match=rf"{re.escape(str(typo))} as a store directory: its parent .* does not"
    ):
        SharedDirFeatureStore(typo)
    assert not (tmp_path / "mnt").exists()
    assert SharedDirFeatureStore(typo, create=True).directory == str(typo) and typo.is_dir()
    leaf = tmp_path / "leaf"  # only the last component missing: created
    SharedDirFeatureStore(leaf)
    assert leaf.is_dir() and os.listdir(leaf) == []  # the write check leaves nothing behind


def test_an_unwritable_directory_is_refused_at_construction(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        directory = Path("/sys")  # root may write anywhere a permission bit says no; sysfs refuses new files
    else:
        directory = tmp_path / "read-only"
        directory.mkdir()
        directory.chmod(0o555)
    with pytest.raises(OSError, match=rf"cannot use {re.escape(str(directory))} as a store directory: it is not wr"):
        SharedDirFeatureStore(directory)
