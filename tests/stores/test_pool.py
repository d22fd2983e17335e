"""Pooled stores: reused memory and files, byte for byte the unpooled ones', never seen through an older handle."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

from featurestream import LocalFeatureStore, SharedDirFeatureStore
from featurestream.stores import arena
from featurestream.stores.arena import entries, is_slot
from featurestream.stores.pool import copy_bytes
from featurestream.testing import sample_tensors

CAPS = {"max_samples": None, "max_bytes": 1 << 20}


def tensors(index: int, tokens: int = 16) -> dict[str, torch.Tensor]:
    """A sample whose values name it; ``tokens`` varies its size, so blocks and slots of other sizes get reused."""
    out = sample_tensors(index, tokens)
    out["logits"] = torch.arange(tokens * 8, dtype=torch.float32).reshape(1, tokens, 8) + index
    return out


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(a[n].dtype == b[n].dtype and torch.equal(a[n], b[n]) for n in a)


def stores(tmp_path: Path, pool: bool) -> list[object]:
    return [
        LocalFeatureStore(pool=pool, **CAPS),
        SharedDirFeatureStore(tmp_path / str(pool), create=True, pool=pool, **CAPS),
    ]


@pytest.mark.parametrize("kind", [0, 1], ids=["local", "shared"])
def test_pooled_and_unpooled_stores_return_the_same_bytes(tmp_path: Path, kind: int) -> None:
    pooled, plain = stores(tmp_path, True)[kind], stores(tmp_path, False)[kind]
    for index, tokens in enumerate([16, 16, 9, 31, 16, 4, 31, 16]):
        given = tensors(index, tokens)
        got = []
        for store in (pooled, plain):
            ref = store.put(f"s{index}", given)
            out, handle = store.get(ref)
            got.append({n: t.clone() for n, t in out.items()})
            store.release(handle)
            if isinstance(store, SharedDirFeatureStore) and index == 0:
                assert not store.is_resident(f"s{index}")
        assert same(got[0], given) and same(got[1], given)
        for name in given:  # the exact bytes, not only equal values
            assert (
                got[0][name].view(torch.uint8).reshape(-1).tolist()
                == given[name].view(torch.uint8).reshape(-1).tolist()
            )
    assert pooled.health().pool_bytes > 0 and plain.health().pool_bytes == 0
    assert pooled.health().pool_bytes <= CAPS["max_bytes"] + 31 * 1024  # the cap plus one sample


def test_shared_dir_files_of_the_arena_are_the_unpooled_files_byte_for_byte(tmp_path: Path) -> None:
    pooled, plain = stores(tmp_path, True)[1], stores(tmp_path, False)[1]
    for index, tokens in enumerate([16, 9, 16, 31]):
        refs = [store.put(f"s{index}", tensors(index, tokens)) for store in (pooled, plain)]
        files = [Path(store.data_path(ref)).read_bytes() for store, ref in zip((pooled, plain), refs, strict=True)]
        assert files[0] == files[1]
        for store, ref in zip((pooled, plain), refs, strict=True):
            store.scrub(ref)
    assert any(is_slot(name) for name in os.listdir(tmp_path / "True"))
    assert not any(is_slot(name) for name in os.listdir(tmp_path / "False"))


def test_the_local_pool_reuses_a_freed_sample_s_block_but_never_one_a_tensor_still_views() -> None:
    store = LocalFeatureStore(**CAPS)
    first = store.put("a", tensors(1))
    held, handle = store.get(first, copy=False)  # the stored tensors themselves
    address = held["logits"].data_ptr()
    store.scrub(first)  # freed whatever handles are out
    for index in range(2, 6):
        ref = store.put(f"s{index}", tensors(index))
        stored, _ = store.get(ref, copy=False)
        assert stored["logits"].data_ptr() != address, "a block an old handle's tensor views was handed out again"
        del stored
        store.scrub(ref)
    assert same(held, tensors(1)), "the old handle's tensors still hold the first sample"
    store.release(handle)
    del held
    reused = store.put("b", tensors(9))
    assert store.get(reused, copy=False)[0]["logits"].data_ptr() == address, "a block nothing views is reused"


def test_a_default_get_is_the_caller_s_to_mutate_and_reused_once_dropped() -> None:
    store = LocalFeatureStore(**CAPS)
    ref = store.put("a", tensors(1))
    mine, _ = store.get(ref)
    mine["logits"].zero_()
    assert same(store.get(ref)[0], tensors(1)), "the caller's copy is its own"
    before = store.health().pool_bytes
    for _ in range(5):
        store.get(ref)  # each copy dropped at once: the same block again
    assert store.health().pool_bytes == before


def test_copy_false_on_the_shared_dir_maps_read_only_and_a_write_raises(tmp_path: Path) -> None:
    store = SharedDirFeatureStore(tmp_path, **CAPS)
    ref = store.put("a", tensors(1))
    first, _ = store.get(ref, copy=False)
    second, _ = store.get(ref, copy=False)
    with pytest.raises(RuntimeError, match=r"[Ii]nplace update to inference tensor"):
        first["logits"].add_(1)
    with pytest.raises(RuntimeError, match=r"[Ii]nplace update to inference tensor"):
        first["logits"][0, 0, 0] = -1
    assert same(second, tensors(1)), "a write into one reader's mapping never reaches another's"
    assert same(store.get(ref)[0], tensors(1)), "nor the file"
    private, _ = store.get(ref)
    private["logits"].add_(1)  # the default get still copies: the caller may mutate it
    assert same(store.get(ref, copy=False)[0], tensors(1))


def test_a_mapped_sample_keeps_its_bytes_through_scrub_and_reuse_then_its_slot_is_reused(tmp_path: Path) -> None:
    store = SharedDirFeatureStore(tmp_path, **CAPS)
    ref = store.put("a", tensors(1))
    mapped, handle = store.get(ref, copy=False)
    store.scrub(ref)
    for index in range(2, 8):  # every put while the mapping lives needs another slot
        store.scrub(store.put(f"s{index}", tensors(index)))
    assert same(mapped, tensors(1)), "a slot a reader still maps was reused"
    slots = len([name for name in os.listdir(tmp_path) if is_slot(name)])
    assert slots == 2, "one slot mapped, one reused by every later put"
    store.release(handle)
    del mapped
    for index in range(8, 12):
        store.scrub(store.put(f"s{index}", tensors(index)))
    assert len([name for name in os.listdir(tmp_path) if is_slot(name)]) == 2, "the freed slot came back"


@pytest.mark.parametrize("copy", [False, True], ids=["mapped", "copied"])
def test_a_reader_that_opened_a_name_before_its_slot_was_reused_gets_key_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, copy: bool
) -> None:
    writer, reader = SharedDirFeatureStore(tmp_path, **CAPS), SharedDirFeatureStore(tmp_path, **CAPS)
    reader.get(reader_warm := writer.put("warm", tensors(0)))  # the reader keeps a mapping of a slot already
    writer.scrub(reader_warm)
    ref = writer.put("a", tensors(1))
    real_flock = arena.fcntl.flock
    later = []

    def the_slot_is_reused_before_the_lock(fd: int, operation: int) -> None:
        if operation == arena.fcntl.LOCK_SH and not later:  # the reader has the file open, not yet locked
            writer.scrub(ref)
            later.append(writer.put("b", tensors(2)))
        real_flock(fd, operation)

    monkeypatch.setattr(arena.fcntl, "flock", the_slot_is_reused_before_the_lock)
    with pytest.raises(KeyError, match="is not resident"):
        reader.get(ref, copy=copy)
    monkeypatch.setattr(arena.fcntl, "flock", real_flock)
    assert same(reader.get(later[0], copy=copy)[0], tensors(2))


def private_maps(directory: Path) -> list[str]:
    """The lines of this process's private mappings of files in ``directory`` (a reader's kept slot mappings)."""
    lines = Path("/proc/self/maps").read_text().splitlines()
    return [line for line in lines if f" {directory}/" in line and line.split()[1].endswith("p")]


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads /proc/self/maps (Linux)")
def test_a_reader_copies_every_sample_out_of_one_kept_mapping_of_a_slot_until_its_writer_removes_it(
    tmp_path: Path,
) -> None:
    writer, reader = SharedDirFeatureStore(tmp_path, **CAPS), SharedDirFeatureStore(tmp_path, **CAPS)
    for index, tokens in enumerate([16, 16, 16, 9, 9]):
        ref = writer.put(f"s{index}", tensors(index, tokens))
        got, handle = reader.get(ref)
        assert same(got, tensors(index, tokens)), "a kept mapping shows the slot's current sample"
        got["logits"].add_(1)  # the copy is the caller's: the slot, and the next read, never see it
        assert same(reader.get(ref)[0], tensors(index, tokens))
        reader.release(handle)
        writer.scrub(ref)
    slots = [name for name in os.listdir(tmp_path) if is_slot(name)]
    assert len(slots) == 1 and len(private_maps(tmp_path)) == 1, "one slot, mapped once, sized again for 9 tokens"
    writer.close()  # its slot file goes: the reader's mapping would keep its bytes
    reader.gc()
    assert private_maps(tmp_path) == [], "the mapping of a removed slot was let go"


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads /proc/self/maps (Linux)")
def test_a_reader_keeps_at_most_max_slot_maps_mappings(tmp_path: Path) -> None:
    writer, reader = SharedDirFeatureStore(tmp_path, **CAPS), SharedDirFeatureStore(tmp_path, **CAPS)
    refs = [writer.put(f"s{index}", tensors(index)) for index in range(arena.MAX_SLOT_MAPS + 6)]  # a slot each
    for index, ref in enumerate(refs):
        writer.retain(ref)  # queued: a release leaves it
        got, handle = reader.get(ref)
        assert same(got, tensors(index))
        reader.release(handle)
    assert len(private_maps(tmp_path)) == arena.MAX_SLOT_MAPS, "one descriptor per kept mapping: bounded"
    assert same(reader.get(refs[0])[0], tensors(0)), "a slot let go is mapped again"


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads /proc/self/maps (Linux)")
def test_a_reader_keeps_no_mapping_of_a_file_of_its_own(tmp_path: Path) -> None:
    writer, reader = SharedDirFeatureStore(tmp_path, pool=False, **CAPS), SharedDirFeatureStore(tmp_path, **CAPS)
    ref = writer.put("a", tensors(1))
    got, handle = reader.get(ref)
    assert same(got, tensors(1)) and private_maps(tmp_path) == [], "a mapping would keep a freed sample's bytes"
    reader.release(handle)


def test_a_seeded_arena_that_ignores_readers_corrupts_a_mapping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock is what protects a mapping: a slot taken on its link count alone is rewritten under a reader."""
    monkeypatch.setattr(arena._Slot, "free", lambda slot: os.fstat(slot.fd).st_nlink == 1)
    store = SharedDirFeatureStore(tmp_path, **CAPS)
    ref = store.put("a", tensors(1))
    mapped, _ = store.get(ref, copy=False)
    store.scrub(ref)
    store.scrub(store.put("b", tensors(2)))
    assert same(mapped, tensors(2)), "the seeded defect shows: the old handle reads the later sample"


def test_a_full_disk_while_sizing_a_slot_stores_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SharedDirFeatureStore(tmp_path, **CAPS)

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(arena.os, "posix_fallocate", full)
    with pytest.raises(OSError, match=r"cannot write sample 'a'.*disk holding .* is full") as info:
        store.put("a", tensors(1))
    assert info.value.errno == errno.ENOSPC and entries(tmp_path) == [] and store.health().sample_count == 0
    monkeypatch.undo()
    assert same(store.get(store.put("a", tensors(1)))[0], tensors(1)), "the id is free to retry"


@pytest.mark.parametrize("kind", [0, 1], ids=["local", "shared"])
def test_a_pool_holds_at_most_its_cap_plus_one_sample(tmp_path: Path, kind: int) -> None:
    sample_bytes = sum(t.numel() * t.element_size() for t in tensors(0, 64).values())
    cap = 3 * sample_bytes
    store = LocalFeatureStore(max_bytes=cap) if kind == 0 else SharedDirFeatureStore(tmp_path, max_bytes=cap)
    pools = 1 if kind == 0 else 2  # the shared dir's arena (files it writes) and its read pool, each capped
    kept = []
    for index in range(12):
        ref = store.put(f"s{index}", tensors(index, 64))
        got, handle = store.get(ref)
        kept.append(got)  # copies held by their caller: the pool cannot reuse them and must not keep them all
        store.release(handle)
        assert store.health().pool_bytes <= pools * (cap + 2 * sample_bytes)  # one sample, rounded up to blocks
    assert all(same(got, tensors(index, 64)) for index, got in enumerate(kept))


@pytest.mark.parametrize(("start", "end"), [(0, 4096), (8, 4093), (3, 4096), (5, 11), (0, 0)])
def test_copy_bytes_copies_every_byte_aligned_or_not(start: int, end: int) -> None:
    source = torch.arange(4096, dtype=torch.int64).to(torch.uint8)
    target = torch.zeros(4096, dtype=torch.uint8)
    copy_bytes(target[start:end], source[start:end])
    assert torch.equal(target[start:end], source[start:end]) and not target[end:].any() and not target[:start].any()
