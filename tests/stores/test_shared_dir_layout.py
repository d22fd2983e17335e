"""SharedDirFeatureStore in the reference's layout: ``<dir>/<id>.safetensors`` and refs keyed ``<id>/<feature>``.

A reader that knows only the reference's layout finds the current put of each sample at ``<id>.safetensors``; a
directory of files written the reference's way (by ``safetensors.torch``, refs keyed ``<id>/<feature>``) is read,
queued and scrubbed through the store. The incarnation safety stays: a stale handle never frees a later put,
two instances' puts never clobber each other, and a ref that names no put never frees one.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from featurestream import SampleRef, SampleRefQueue, SharedDirFeatureStore
from featurestream.common.refs import FeatureSpec
from featurestream.stores.arena import entries
from support.helpers import assert_is_sample, eagle3_sample, put_eagle3


def reference_ref(directory: Path, sample_id: str, tensors: dict[str, torch.Tensor]) -> SampleRef:
    """The ref the reference's store (or an offline precompute tool) writes for ``<directory>/<id>.safetensors``."""
    specs = {name: FeatureSpec(shape=tuple(t.shape), dtype=t.dtype) for name, t in tensors.items()}
    return SampleRef(
        sample_id=sample_id,
        run_id="offline",
        store_uri=f"file://{directory}",
        feature_keys={name: f"{sample_id}/{name}" for name in tensors},
        feature_specs=specs,
        algorithm="eagle3",
        schema_version=1,
        num_tokens=0,
        estimated_bytes=sum(spec.nbytes for spec in specs.values()),
        target_model_version="0",
        draft_weight_version="0",
    )


def visible(directory: Path) -> list[str]:
    """What a reader that knows only the reference's layout lists: ``<id>.safetensors`` names."""
    return sorted(name for name in os.listdir(directory) if name.endswith(".safetensors") and "@" not in name)


def settle(store: SharedDirFeatureStore) -> None:
    store._deleter.flush()  # the background unlinks of removed samples


def assert_same(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name


def test_a_put_is_at_its_reference_name_until_its_last_release(tmp_path: Path) -> None:
    store = SharedDirFeatureStore(tmp_path)
    ref = put_eagle3(store, 1)
    path = tmp_path / "s1.safetensors"
    assert os.path.isfile(path) and visible(tmp_path) == ["s1.safetensors"]
    assert_same(load_file(path), eagle3_sample(1))
    _, handle = store.get(ref)
    store.release(handle)
    settle(store)
    assert not os.path.lexists(path) and entries(tmp_path) == []


def test_close_and_scrub_remove_the_reference_name(tmp_path: Path) -> None:
    store = SharedDirFeatureStore(tmp_path)
    scrubbed, closed = put_eagle3(store, 1), put_eagle3(store, 2)
    store.retain(scrubbed)
    store.scrub(scrubbed)
    assert not os.path.lexists(tmp_path / "s1.safetensors") and visible(tmp_path) == ["s2.safetensors"]
    store.close()
    assert entries(tmp_path) == [], closed


def test_the_reference_name_follows_the_latest_put_and_a_stale_handle_frees_nothing_of_it(tmp_path: Path) -> None:
    writer, reader = SharedDirFeatureStore(tmp_path), SharedDirFeatureStore(tmp_path)
    first = put_eagle3(writer, 1)
    _, stale = reader.get(first)
    writer.retain(first)
    writer.scrub(first)  # acked: gone, the reader's handle still out
    second = writer.put("s1", eagle3_sample(2), run_id="run")
    assert_same(load_file(tmp_path / "s1.safetensors"), eagle3_sample(2))
    reader.release(stale)
    settle(writer)
    assert_same(load_file(tmp_path / "s1.safetensors"), eagle3_sample(2))
    got, _ = reader.get(second)
    assert_is_sample(got, 2)


def test_two_instances_puts_of_one_id_never_clobber_each_other(tmp_path: Path) -> None:
    one, two, reader = (SharedDirFeatureStore(tmp_path) for _ in range(3))
    earlier = put_eagle3(one, 1)
    later = two.put("s1", eagle3_sample(3), run_id="run")
    assert_same(load_file(tmp_path / "s1.safetensors"), eagle3_sample(3))  # the latest put
    assert_is_sample(reader.get(earlier)[0], 1)
    two.close()  # the later put is freed: its reference name goes, the earlier put's data stays
    assert not os.path.lexists(tmp_path / "s1.safetensors")
    assert_is_sample(reader.get(earlier)[0], 1)
    with pytest.raises(KeyError, match="is gone"):
        reader.get(later)


def test_a_plain_safetensors_file_with_a_reference_key_ref_is_read_queued_and_scrubbed(tmp_path: Path) -> None:
    """How offline precompute tools hand over their files: ``000.safetensors`` and refs keyed ``000/<feature>``."""
    tensors = eagle3_sample(4)
    save_file(tensors, tmp_path / "000.safetensors")
    store = SharedDirFeatureStore(tmp_path)
    ref = reference_ref(tmp_path, "000", tensors)
    assert store.is_resident("000")
    got, handle = store.get(ref)
    assert_same(got, tensors)
    queue = SampleRefQueue(store)
    queue.put(ref)
    store.release(handle)  # the queue holds it: a release never frees it
    assert os.path.isfile(tmp_path / "000.safetensors") and os.path.isfile(tmp_path / "000.retained")
    lease = queue.acquire(timeout=1)
    assert lease is not None
    assert_same(store.get(lease.ref)[0], tensors)
    queue.ack(lease)
    settle(store)
    assert entries(tmp_path) == [] and not store.is_resident("000")
    assert store.health().sample_count == 0 and store.health().resident_bytes == 0


def test_a_plain_file_no_queue_holds_is_freed_on_its_last_release(tmp_path: Path) -> None:
    save_file(eagle3_sample(5), tmp_path / "p.safetensors")
    store = SharedDirFeatureStore(tmp_path)
    _, handle = store.get(reference_ref(tmp_path, "p", eagle3_sample(5)))
    store.release(handle)
    settle(store)
    assert entries(tmp_path) == []


def test_a_reference_key_ref_reads_a_put_but_never_frees_it(tmp_path: Path) -> None:
    writer, other = SharedDirFeatureStore(tmp_path), SharedDirFeatureStore(tmp_path)
    ref = put_eagle3(writer, 6)
    incarnation_less = reference_ref(tmp_path, "s6", eagle3_sample(6))
    got, handle = other.get(incarnation_less)
    assert_is_sample(got, 6)
    other.release(handle)
    other.retain(incarnation_less)
    other.scrub(incarnation_less)
    settle(other)
    assert os.path.islink(tmp_path / "s6.safetensors") and other.is_resident("s6")
    assert_is_sample(other.get(ref)[0], 6)
    assert writer.health().sample_count == 1


def test_a_put_over_a_file_in_the_reference_layout_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    save_file(eagle3_sample(7), tmp_path / "s7.safetensors")
    before = (tmp_path / "s7.safetensors").read_bytes()
    store = SharedDirFeatureStore(tmp_path)
    with pytest.raises(ValueError, match=r"'s7' is already present .*s7\.safetensors"):
        put_eagle3(store, 7)
    assert entries(tmp_path) == ["s7.safetensors"] and (tmp_path / "s7.safetensors").read_bytes() == before
    assert store.health().sample_count == 0 and store.health().resident_bytes == 0


def test_an_id_that_ends_like_an_incarnation_is_refused(tmp_path: Path) -> None:
    store = SharedDirFeatureStore(tmp_path)
    sample_id = "s8@" + "0" * 32
    with pytest.raises(ValueError, match=f"sample_id '{sample_id}' may not end in @<32 hex digits>"):
        store.put(sample_id, eagle3_sample(8), run_id="run")
    assert entries(tmp_path) == []


def test_a_ref_in_neither_key_format_is_refused(tmp_path: Path) -> None:
    store = SharedDirFeatureStore(tmp_path)
    ref = put_eagle3(store, 9)
    forged = SampleRef(**{**vars(ref), "feature_keys": {name: f"elsewhere/{name}" for name in ref.feature_keys}})
    with pytest.raises(KeyError, match=r"names no incarnation .*or s9/"):
        store.get(forged)
    assert store.health().sample_count == 1


def test_a_tool_that_rewrites_the_reference_name_never_meets_the_put_it_replaced(tmp_path: Path) -> None:
    """``safetensors.torch.save_file`` over ``<id>.safetensors`` replaces the link with a file of its own: that
    file is then a sample in the reference's layout, and the put's own ref still reads, and frees, only its put."""
    store = SharedDirFeatureStore(tmp_path)
    ref = put_eagle3(store, 1)
    save_file(eagle3_sample(2), tmp_path / "s1.safetensors")
    assert not os.path.islink(tmp_path / "s1.safetensors")
    got, handle = store.get(ref)
    assert_is_sample(got, 1)
    store.release(handle)
    settle(store)
    assert entries(tmp_path) == ["s1.safetensors"], "the put is freed; the tool's file stays"
    assert_same(load_file(tmp_path / "s1.safetensors"), eagle3_sample(2))
    assert store.is_resident("s1") and store.health().sample_count == 0
