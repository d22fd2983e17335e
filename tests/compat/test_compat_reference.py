"""Side by side with the real reference package: its target backends, its batch class, its core behaviours.

A recipe switched to featurestream keeps the reference's EAGLE-3 backends (they live outside its streaming
package) and its ``Eagle3TargetBatch`` checks; each test runs the recipe's code against featurestream and, where
the two should agree, against the reference too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import time
import unittest.mock
from pathlib import Path
from typing import Any

import pytest
import torch

import featurestream
from featurestream.backends.redis.wire import ref_to_json
from featurestream.eagle3 import Eagle3TargetBatch
from featurestream.loader import FeatureDataLoader
from featurestream.producer import FeatureProducer
from featurestream.queue import SampleRefQueue
from featurestream.refs import FeatureAlgorithm, SampleRef
from featurestream.stores.arena import entries
from featurestream.stores.local import LocalFeatureStore
from featurestream.stores.shared_dir import SharedDirFeatureStore
from featurestream.tools.models import TinyConfig, tiny_hf_causal_lm

from .conftest import Reference
from .recipe import EchoTarget, prompt, sample_tensors

CONFIG = TinyConfig(vocab_size=64, hidden_size=32, num_layers=4, num_heads=4, max_seq_len=32)


def reference_echo(reference: Reference, *, draft_vocab: bool = False) -> Any:
    """``recipe.EchoTarget`` rebased on the reference's ``Eagle3TargetBackend``, returning its ``Eagle3TargetBatch``."""

    class ReferenceEcho(reference.backend.Eagle3TargetBackend):  # type: ignore[name-defined,misc]
        def __init__(self) -> None:
            self.inner = EchoTarget()

        def generate_batch(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor,
                           **packing: torch.Tensor | None) -> Any:  # fmt: skip
            ours = self.inner.generate_batch(
                input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask, **packing
            )
            fields = {name: getattr(ours, name) for name in ours.keys()}
            if draft_vocab:
                fields["target_probs"] = fields.pop("logits").softmax(-1)
                fields["position_mask"] = torch.ones_like(loss_mask)
            return reference.target.Eagle3TargetBatch(**fields)

        def get_input_embeddings(self) -> torch.nn.Module:
            return self.inner.get_input_embeddings()

    return ReferenceEcho()


def test_featurestream_never_imports_the_reference() -> None:
    code = (
        "import sys, featurestream, featurestream.producer, featurestream.loader, featurestream.hf, "
        "featurestream.async_pipeline\n"
        "print(sorted(name for name in sys.modules if name.startswith('nemo_automodel')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_reference_modules_a_recipe_imports_import_on_cpu(reference: Reference) -> None:
    assert reference.backend.Eagle3TargetBackend.__module__ == "nemo_automodel.components.speculative.eagle.backend"
    assert reference.target.Eagle3TargetBatch.__module__ == "nemo_automodel.components.speculative.eagle.target"
    assert issubclass(reference.target.HFEagle3TargetModel, reference.backend.Eagle3TargetBackend)
    for name in ("SampleRefQueue", "FeatureProducer", "FeatureDataLoader", "LocalFeatureStore"):
        assert hasattr(reference.streaming, name), name


def test_the_producer_infers_eagle3_from_the_references_backends(reference: Reference) -> None:
    store = LocalFeatureStore()
    hf_target = reference.target.HFEagle3TargetModel(tiny_hf_causal_lm("llama", CONFIG, num_layers=8))
    for backend in (reference_echo(reference), hf_target):
        producer = FeatureProducer(backend, store, run_id="r")
        assert producer.algorithm is FeatureAlgorithm.EAGLE3
        ref = producer.produce(**prompt(0))
        assert ref.algorithm is FeatureAlgorithm.EAGLE3
        producer.discard(ref)

    spec_only = unittest.mock.MagicMock(spec=reference.backend.Eagle3TargetBackend)
    assert FeatureProducer(spec_only, store, run_id="r").algorithm is FeatureAlgorithm.EAGLE3, "isinstance, as theirs"

    class NotATarget:
        def generate_batch(self, **inputs: Any) -> Any:
            raise AssertionError("never called")

    with pytest.raises(ValueError, match=r"cannot infer FeatureAlgorithm.*eagle\.backend\.Eagle3TargetBackend"):
        FeatureProducer(NotATarget(), store, run_id="r")


def test_run_id_is_checked_before_the_algorithm_is_inferred_as_in_the_reference(reference: Reference) -> None:
    for producer_class, store in (
        (FeatureProducer, LocalFeatureStore()),
        (reference.streaming.FeatureProducer, reference.streaming.LocalFeatureStore()),
    ):
        with pytest.raises(ValueError, match="run_id"):
            producer_class(object(), store, run_id="")


def test_a_precomputed_draft_vocab_batch_is_stored_by_ours_and_refused_by_the_references(
    reference: Reference,
) -> None:
    target = reference_echo(reference, draft_vocab=True)
    batch = target.generate_batch(**prompt(0))
    expected = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch) if getattr(batch, f.name) is not None}
    ours = FeatureProducer(target, store := LocalFeatureStore(), run_id="r")
    queue = SampleRefQueue(store)
    queue.put(ref := ours.produce(**prompt(0)))
    assert list(ref.feature_keys) == list(expected) and "logits" not in ref.feature_keys
    queue.close()
    with FeatureDataLoader(queue, store) as loader:
        (loaded,) = list(loader)
    assert loaded.logits is None and loaded.keys() == list(expected)
    assert all(torch.equal(loaded[name], tensor) for name, tensor in expected.items())
    theirs = reference.streaming.FeatureProducer(
        reference_echo(reference, draft_vocab=True), reference.streaming.LocalFeatureStore(), run_id="r"
    )
    with pytest.raises(ValueError, match=r"requires .*\.logits"):
        theirs.produce(**prompt(0))


def test_the_loader_yields_the_references_batch_class_and_keeps_its_own(reference: Reference) -> None:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    queue.put(store.put("s0", sample_tensors(0)))
    queue.close()
    with FeatureDataLoader(queue, store) as loader:
        (batch,) = list(loader)
    assert isinstance(batch, reference.target.Eagle3TargetBatch) and isinstance(batch, Eagle3TargetBatch)
    assert batch["logits"] is batch.logits, "featurestream's own reading by name still works"
    theirs = reference.target.Eagle3TargetBatch(**{name: getattr(batch, name) for name in batch.keys()})
    expected = theirs.to_trainer_inputs()
    got = batch.to_trainer_inputs()
    assert set(got) == set(expected) and all(got[name] is expected[name] for name in expected)
    assert type(FeatureDataLoader(SampleRefQueue(store), store).batch_type) is type(type(batch)), "one class"


def test_an_explicit_batch_type_wins(reference: Reference) -> None:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    queue.put(store.put("s0", sample_tensors(0)))
    queue.close()
    with FeatureDataLoader(queue, store, batch_type=reference.target.Eagle3TargetBatch) as loader:
        (batch,) = list(loader)
    assert type(batch) is reference.target.Eagle3TargetBatch


CONSUMER = """
import json, sys
if sys.argv[2] == "reference":
    from nemo_automodel.components.speculative.eagle.target import Eagle3TargetBatch as RecipeBatch
from featurestream.backends.redis.wire import ref_from_json
from featurestream.loader import FeatureDataLoader
from featurestream.queue import SampleRefQueue
from featurestream.stores.shared_dir import SharedDirFeatureStore

store = SharedDirFeatureStore(sys.argv[1])
queue = SampleRefQueue(store)
for line in sys.stdin:
    queue.put(ref_from_json(line))
queue.close()
with FeatureDataLoader(queue, store) as loader:
    batches = list(loader)
kinds = sorted({f"{type(b).__mro__[1].__module__}.{type(b).__mro__[1].__qualname__}" for b in batches})
print(json.dumps({
    "count": len(batches),
    "reference": sys.argv[2] == "reference" and all(isinstance(b, RecipeBatch) for b in batches),
    "logits": [b.logits.sum().item() for b in batches],
    "mro": [f"{c.__module__}.{c.__qualname__}" for c in type(batches[0]).__mro__],
}))
"""


@pytest.mark.parametrize("consumer", ["reference", "featurestream"])
def test_a_loader_in_another_process_follows_that_process(reference: Reference, tmp_path: Path, consumer: str) -> None:
    """The producer's process has the reference loaded; the consumer's decides the batch class it gets."""
    store = SharedDirFeatureStore(tmp_path / "store")
    producer = FeatureProducer(reference_echo(reference), store, run_id="r")
    refs: list[SampleRef] = [producer.produce(**prompt(seed)) for seed in range(2)]
    expected = [store.get(ref)[0]["logits"].sum().item() for ref in refs]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CONSUMER), str(tmp_path / "store"), consumer],
        input="".join(ref_to_json(ref) + "\n" for ref in refs),
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["count"] == 2 and report["logits"] == expected
    reference_class = "nemo_automodel.components.speculative.eagle.target.Eagle3TargetBatch"
    if consumer == "reference":
        assert report["reference"] and reference_class in report["mro"]
    else:
        assert reference_class not in report["mro"], "a consumer without the reference gets featurestream's class"
    assert "featurestream.pipeline.eagle3.Eagle3TargetBatch" in report["mro"]


def test_a_pipeline_over_the_references_hf_target_matches_the_references_own(reference: Reference) -> None:
    """Its HFEagle3TargetModel, streamed by featurestream and by the reference: the same batches, bit for bit."""
    model = tiny_hf_causal_lm("qwen3", CONFIG, num_layers=8)
    prompts = [prompt(seed) for seed in range(3)]

    def run(streaming: Any) -> list[Any]:
        store = streaming.LocalFeatureStore()
        queue = streaming.SampleRefQueue(store)
        producer = streaming.FeatureProducer(reference.target.HFEagle3TargetModel(model), store, run_id="r")
        for given in prompts:
            queue.put(producer.produce(**given))
        queue.close()
        with streaming.FeatureDataLoader(queue, store) as loader:
            batches = list(loader)
        assert all(isinstance(batch, reference.target.Eagle3TargetBatch) for batch in batches)
        return [{name: getattr(batch, name) for name in FIELDS} for batch in batches]

    theirs, got = run(reference.streaming), run(featurestream)
    assert len(got) == len(theirs) == 3
    for mine, expected in zip(got, theirs, strict=True):
        for name in FIELDS:
            assert (mine[name] is None) == (expected[name] is None), name
            assert mine[name] is None or torch.equal(mine[name], expected[name]), name


FIELDS = (
    "aux_hidden_states", "input_ids", "attention_mask", "loss_mask", "logits", "target_probs", "position_mask",
    "position_ids", "seq_lens", "doc_remaining",
)  # fmt: skip


@pytest.mark.parametrize(
    "item", [(torch.zeros(1, 2, dtype=torch.long),) * 2, [torch.zeros(1, 2, dtype=torch.long)] * 3]
)
def test_a_prompt_of_the_wrong_shape_fails_both_pipelines_with_type_error(reference: Reference, item: Any) -> None:
    for streaming in (featurestream, reference.streaming):
        store = streaming.LocalFeatureStore()
        queue = streaming.SampleRefQueue(store)
        producer = streaming.FeatureProducer(reference_echo(reference), store, run_id="r")
        pipeline = streaming.AsyncFeaturePipeline(producer, queue, iter([prompt(0)["input_ids"], item]))
        pipeline.start()
        pipeline.join(timeout=30)
        with pytest.raises(TypeError, match="prompt iterator must yield"):
            pipeline.stop()
        assert queue.is_closed and queue.pending_count() == 1, streaming.__name__


# -- core behaviours ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("watermarks", "phrase"),
    [({"high_watermark_bytes": 0}, "positive"), ({"high_watermark_bytes": -1}, "positive"),
     ({"low_watermark_bytes": -1}, "non-negative")],
)  # fmt: skip
def test_out_of_range_watermarks_are_refused_by_both(
    reference: Reference, watermarks: dict[str, int], phrase: str
) -> None:
    for streaming in (featurestream, reference.streaming):
        with pytest.raises(ValueError, match=phrase):
            streaming.SampleRefQueue(streaming.LocalFeatureStore(), **watermarks)


def test_a_dflash_ref_without_a_required_feature_is_refused_by_both(reference: Reference) -> None:
    tensors = {"input_ids": torch.zeros(1, 2, dtype=torch.long), "loss_mask": torch.ones(1, 2, dtype=torch.long)}
    for streaming in (featurestream, reference.streaming):
        store = streaming.LocalFeatureStore()
        with pytest.raises(ValueError, match="missing required features"):
            store.put("d", tensors, run_id="r", algorithm=streaming.FeatureAlgorithm.DFLASH)
        assert store.health().sample_count == 0


def test_a_paused_producer_over_an_empty_queue_differs_as_documented(reference: Reference) -> None:
    """docs/compatibility.md: the reference waits for the low watermark (here forever: nothing can drain); featurestream
    enqueues, because nothing the queue holds could ever lower the store's residency."""
    for streaming, enqueues in ((reference.streaming, False), (featurestream, True)):
        store = streaming.LocalFeatureStore(max_bytes=10_000, high_watermark_bytes=1000, low_watermark_bytes=100)
        store.put("held", sample_tensors(0), run_id="r")  # produced, never queued (624 bytes)
        ref = store.put("next", sample_tensors(1), run_id="r")  # 1248 bytes resident: over the high watermark
        paused: list[Any] = []
        resumed: list[Any] = []
        queue = streaming.SampleRefQueue(store, on_pause=paused.append, on_resume=resumed.append)
        if enqueues:
            queue.put_blocks_until_below(ref, poll_interval=0.0)
            assert queue.pending_count() == 1
        else:
            polls = iter(range(5))  # a few rounds of waiting, then abort
            with pytest.raises(RuntimeError, match="aborted"):
                queue.put_blocks_until_below(ref, poll_interval=0.0, abort_when=lambda p=polls: next(p, None) is None)
            assert queue.pending_count() == 0
        assert len(paused) == 1 and resumed == [], streaming.__name__


def test_a_producer_closing_its_store_differs_as_documented(reference: Reference, tmp_path: Path) -> None:
    """docs/compatibility.md: the reference's close unlinks a sample its queue still holds, and the trainer's get
    then raises; featurestream's keeps it for the trainer (another instance on the directory) until the ack."""
    for streaming, keeps in ((reference.streaming, False), (featurestream, True)):
        directory = tmp_path / streaming.__name__
        producer, trainer = (
            streaming.SharedDirFeatureStore(str(directory)),
            streaming.SharedDirFeatureStore(str(directory)),
        )
        queue = streaming.SampleRefQueue(producer)
        queue.put(producer.put("s0", sample_tensors(0), run_id="r"))
        queue.close()
        producer.close()  # the producer's natural end
        lease = queue.acquire()  # the reference's takes no timeout
        assert lease is not None
        if keeps:
            tensors, handle = trainer.get(lease.ref)
            assert torch.equal(tensors["input_ids"], sample_tensors(0)["input_ids"])
            trainer.release(handle)
            assert queue.ack(lease)
            deadline = time.monotonic() + 10
            while entries(directory) and time.monotonic() < deadline:  # the scrub's unlink runs in the background
                time.sleep(0.01)
            assert entries(directory) == []
        else:
            with pytest.raises(KeyError):
                trainer.get(lease.ref)


# -- a recipe written for the reference, its streaming imports aliased to featurestream ------------------------

ALIASED_RECIPE = """
import importlib, json, sys
import featurestream

STREAMING = "nemo_automodel.components.speculative.streaming"
sys.modules[STREAMING] = featurestream
for name in ("refs", "store", "queue", "stores", "stores.local", "stores.shared_dir", "eagle3", "producer", "loader",
             "async_pipeline"):
    sys.modules[f"{STREAMING}.{name}"] = importlib.import_module(f"featurestream.{name}")

# The recipe, unchanged: its imports, its target, its batch check, its trainer.
import torch
import transformers
from nemo_automodel.components.speculative.eagle.core import Eagle3TrainerModule
from nemo_automodel.components.speculative.eagle.draft_llama import LlamaEagle3DraftModel
from nemo_automodel.components.speculative.eagle.target import Eagle3TargetBatch, HFEagle3TargetModel
from nemo_automodel.components.speculative.streaming.async_pipeline import AsyncFeaturePipeline
from nemo_automodel.components.speculative.streaming.loader import FeatureDataLoader
from nemo_automodel.components.speculative.streaming.producer import FeatureProducer
from nemo_automodel.components.speculative.streaming.queue import SampleRefQueue
from nemo_automodel.components.speculative.streaming.stores.local import LocalFeatureStore
from featurestream.tools.models import TinyConfig, tiny_hf_causal_lm

config = TinyConfig(vocab_size=96, hidden_size=32, num_layers=4, num_heads=4, max_seq_len=32)
target = HFEagle3TargetModel(tiny_hf_causal_lm("llama", config, num_layers=8))
draft_config = transformers.LlamaConfig(
    vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, max_position_embeddings=32,
)
trainer = Eagle3TrainerModule(
    LlamaEagle3DraftModel(draft_config), selected_token_ids=torch.arange(96),
    selected_token_mask=torch.ones(96, dtype=torch.bool), ttt_steps=2,
)
generator = torch.Generator().manual_seed(0)
prompts = []
for _ in range(3):
    input_ids = torch.randint(96, (2, 12), generator=generator)
    loss_mask = torch.ones_like(input_ids)
    loss_mask[:, :3] = 0
    prompts.append((input_ids, torch.ones_like(input_ids), loss_mask))
store = LocalFeatureStore()
queue = SampleRefQueue(store)
producer = FeatureProducer(target, store, run_id="recipe")
losses, colocated = [], []
with AsyncFeaturePipeline(producer, queue, iter(prompts)):
    with FeatureDataLoader(queue, store) as loader:
        for batch in loader:
            assert isinstance(batch, Eagle3TargetBatch), type(batch).__mro__
            losses.append(float(trainer(**batch.to_trainer_inputs()).loss))
for input_ids, attention_mask, loss_mask in prompts:
    batch = target.generate_batch(input_ids, attention_mask, loss_mask)
    colocated.append(float(trainer(**batch.to_trainer_inputs()).loss))
print(json.dumps({"streamed": losses, "colocated": colocated, "acked": queue.stats().acked}))
"""


def test_a_recipe_for_the_reference_runs_on_featurestream_by_import_aliasing(reference: Reference) -> None:
    """Its HF target, its Eagle3TargetBatch check and its EAGLE-3 trainer, with featurestream as its streaming
    package: the streamed batches train to the same losses as the colocated ones."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(ALIASED_RECIPE)],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["acked"] == 3 and len(report["streamed"]) == 3
    assert report["streamed"] == report["colocated"], "bit-identical supervision gives identical losses"


# -- the shared directory, read across the two implementations ------------------------------------------------


def carried(ref: Any, refs: Any) -> Any:
    """``ref`` rebuilt with the ``SampleRef``/``FeatureSpec``/``FeatureAlgorithm`` of the ``refs`` module given."""
    # The fields both classes have: featurestream's ref adds provenance (empty on a plain sample), the reference's
    # has none.
    fields = {name: getattr(ref, name) for name in refs.SampleRef.__dataclass_fields__ if hasattr(ref, name)}
    fields["feature_specs"] = {
        name: refs.FeatureSpec(shape=tuple(spec.shape), dtype=spec.dtype) for name, spec in ref.feature_specs.items()
    }
    fields["algorithm"] = refs.FeatureAlgorithm(ref.algorithm.value)
    return refs.SampleRef(**fields)


def test_each_shared_dir_store_reads_what_the_other_wrote(reference: Reference, tmp_path: Path) -> None:
    """The reference's layout both ways: its store's files and refs (keyed ``<id>/<feature>``) are read, queued and
    scrubbed through featurestream's; featurestream's puts are at ``<id>.safetensors`` for the reference's store."""
    theirs = reference.module("stores.shared_dir").SharedDirFeatureStore(str(tmp_path))
    ours = SharedDirFeatureStore(tmp_path)
    queue = SampleRefQueue(ours)
    queue.put(carried(theirs.put("000", sample_tensors(0), run_id="r"), featurestream.refs))
    lease = queue.acquire(timeout=1)
    assert lease is not None
    got, handle = ours.get(lease.ref)
    assert all(torch.equal(got[name], tensor) for name, tensor in sample_tensors(0).items())
    ours.release(handle)
    queue.ack(lease)
    ours.close()
    assert not os.path.exists(tmp_path / "000.safetensors")

    ours = SharedDirFeatureStore(tmp_path)
    mine = ours.put("001", sample_tensors(1), run_id="r")
    loaded, _ = theirs.get(carried(mine, reference.module("refs")))
    assert all(torch.equal(loaded[name], tensor) for name, tensor in sample_tensors(1).items())
    ours.close()
    assert entries(tmp_path) == []


def test_the_file_lifecycle_a_reference_layout_reader_sees_is_the_references(
    reference: Reference, tmp_path: Path
) -> None:
    """What a reader that knows only ``<dir>/<id>.safetensors`` observes, step by step, for both stores."""
    from safetensors.torch import load_file

    def observe(store_class: Any, directory: Path) -> list[object]:
        seen: list[object] = []

        def look(index: int) -> None:
            path = directory / f"s{index}.safetensors"
            expected = sample_tensors(index)
            seen.append(path.is_file() and all(torch.equal(load_file(path)[n], t) for n, t in expected.items()))

        writer, reader = store_class(str(directory)), store_class(str(directory))
        ref = writer.put("s0", sample_tensors(0), run_id="r")
        look(0)  # put: the sample is at its reference name
        _, first = writer.get(ref)
        _, second = writer.get(ref)
        writer.release(first)
        look(0)  # a sibling handle still out: kept
        writer.release(second)
        writer.release(second)  # released twice: a no-op
        look(0)  # last handle released: gone
        ref = writer.put("s1", sample_tensors(1), run_id="r")
        got, handle = reader.get(ref)  # another instance on the directory
        seen.append(all(torch.equal(got[name], tensor) for name, tensor in sample_tensors(1).items()))
        reader.release(handle)
        look(1)  # its last release frees it too
        writer.put("s2", sample_tensors(2), run_id="r")
        look(2)
        writer.close()
        look(2)  # close frees what the instance wrote
        return seen

    theirs = observe(reference.module("stores.shared_dir").SharedDirFeatureStore, tmp_path / "theirs")
    ours = observe(SharedDirFeatureStore, tmp_path / "ours")
    assert theirs == [True, True, False, True, False, True, False]
    assert ours == theirs
