"""The EAGLE-3 v1 schema, Eagle3TargetBatch, and the algorithm schema registry."""

from __future__ import annotations

import dataclasses
import pathlib
import pickle
import sys
import types

import pytest
import torch

from compat.recipe import RecipeBatch  # a batch class with no from_tensors
from featurestream import Eagle3TargetBatch, FeatureAlgorithm, LocalFeatureStore, SampleRefQueue
from featurestream.common.refs import REQUIRED_FEATURES
from featurestream.pipeline import eagle3, schemas
from featurestream.pipeline.eagle3 import (
    DraftVocab,
    DraftVocabTarget,
    check_feature_names,
    feature_tensors,
    project_to_draft_vocab,
    validate_eagle3_ref,
    validate_ref,
)
from featurestream.pipeline.producer import FeatureProducer
from featurestream.stores.shared_dir import SharedDirFeatureStore
from support.helpers import eagle3_sample, untrainable_eagle3_sample

CORE = ["aux_hidden_states", "input_ids", "attention_mask", "loss_mask"]
PACKING = ["position_ids", "seq_lens", "doc_remaining"]


@pytest.mark.parametrize(
    "names",
    [
        [*CORE, "logits"],
        [*CORE, "target_probs", "position_mask"],
        [*CORE, "logits", *PACKING],
    ],
)
def test_valid_feature_sets(names: list[str]) -> None:
    check_feature_names(names)


@pytest.mark.parametrize(
    ("names", "match"),
    [
        (CORE, "no supervision encoding"),
        ([*CORE, "logits", "target_probs", "position_mask"], "both 'logits' and draft-vocab features"),
        ([*CORE, "target_probs"], "partial draft-vocab encoding"),
        ([*CORE, "logits", "position_mask"], "partial draft-vocab encoding"),
        ([*CORE, "logits", "position_ids"], "position_ids, seq_lens, and doc_remaining together"),
        ([*CORE[1:], "logits"], "missing required core features"),
        ([*CORE, "logits", "extra"], "no features"),
    ],
)
def test_invalid_feature_sets(names: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_feature_names(names)


@pytest.mark.parametrize("store_kind", ["local", "shared_dir"])
def test_a_sample_without_supervision_is_stored_and_queued_as_the_references_stores_do(
    store_kind: str, tmp_path: pathlib.Path
) -> None:
    # Stores and queues take any feature set that has the core features (the reference's rule); the producer
    # refuses to store such a sample and the loader dead-letters it (tests/core/test_schema_dead_letters.py).
    store = LocalFeatureStore() if store_kind == "local" else SharedDirFeatureStore(tmp_path)
    queue = SampleRefQueue(store)
    core_only = {name: eagle3_sample(0)[name] for name in CORE}
    probs_only = {**core_only, "target_probs": torch.ones(1, 4, 2)}  # half of the draft-vocab pair
    refs = [store.put("unsupervised", core_only), store.put("half", probs_only)]
    queue.put_many(refs)
    assert queue.pending_count() == 2 and store.health().sample_count == 2
    assert [sorted(ref.feature_keys) for ref in refs] == [sorted(core_only), sorted(probs_only)]
    with pytest.raises(ValueError, match=r"'unsupervised': eagle3 sample has no supervision encoding"):
        validate_eagle3_ref(refs[0])
    with pytest.raises(ValueError, match=r"'half': eagle3 sample has a partial draft-vocab encoding"):
        validate_eagle3_ref(refs[1])
    with pytest.raises(ValueError, match=r"missing required features \['loss_mask'\]"):
        store.put("no-loss-mask", {name: core_only[name] for name in CORE[:3]})  # the reference's rule still holds


def test_validate_ref_checks_algorithm_version_and_names() -> None:
    store = LocalFeatureStore()
    validate_ref(store.put("ok", eagle3_sample(0)))
    with pytest.raises(ValueError, match=r"'v2': eagle3 schema_version must be 1, got 2"):
        validate_ref(store.put("v2", eagle3_sample(0), schema_version=2))
    with pytest.raises(ValueError, match=r"'both'.*both 'logits' and draft-vocab features"):
        validate_ref(store.put("both", untrainable_eagle3_sample(0)))
    dflash = {"hidden_states": torch.zeros(1), **{n: torch.zeros(1) for n in CORE[1:]}}
    with pytest.raises(ValueError, match=r"must be FeatureAlgorithm.EAGLE3 \(got <FeatureAlgorithm.DFLASH"):
        validate_ref(store.put("d", dflash, algorithm=FeatureAlgorithm.DFLASH))


def test_batch_reads_by_attribute_and_by_name_in_schema_order() -> None:
    tensors = eagle3_sample(1)
    batch = Eagle3TargetBatch.from_tensors(dict(reversed(tensors.items())))
    assert batch.logits is tensors["logits"] and batch["input_ids"] is tensors["input_ids"]
    assert list(batch) == [*CORE, "logits"] and "logits" in batch and "target_probs" not in batch
    with pytest.raises(KeyError):
        batch["target_probs"]
    with pytest.raises(ValueError, match=r"no supervision encoding"):
        Eagle3TargetBatch(**{n: tensors[n] for n in CORE})
    with pytest.raises(TypeError, match=r"must be a torch.Tensor"):
        feature_tensors({**tensors, "logits": [1.0]})


def test_to_trainer_inputs_gives_the_encoding_the_batch_carries() -> None:
    tensors = eagle3_sample(1)
    inputs = Eagle3TargetBatch.from_tensors(tensors).to_trainer_inputs()
    assert list(inputs) == [*CORE, "target_logits"] and inputs["target_logits"] is tensors["logits"]
    probs = {**{n: tensors[n] for n in CORE}, "target_probs": tensors["logits"], "position_mask": tensors["loss_mask"]}
    packing = {"position_ids": tensors["input_ids"], "seq_lens": torch.tensor([4]), "doc_remaining": torch.tensor([0])}
    packed = {**probs, **packing}
    inputs = Eagle3TargetBatch.from_tensors(packed).to_trainer_inputs()
    assert list(inputs) == [*CORE, "target_probs", "position_mask", *PACKING]
    assert all(inputs[name] is packed[name] for name in packed)


def test_the_eagle3_schema_is_registered_and_its_core_set_is_the_control_planes() -> None:
    schema = schemas.schema_for(FeatureAlgorithm.EAGLE3)
    assert schema is eagle3.EAGLE3_SCHEMA and schemas.schema_for("eagle3") is schema
    assert schema.required_features is REQUIRED_FEATURES[FeatureAlgorithm.EAGLE3] is eagle3.CORE_FEATURES
    assert schema.feature_order == eagle3.FEATURE_ORDER and schema.schema_version == 1
    assert schema.batch_type is Eagle3TargetBatch and schema.backend_type is eagle3.Eagle3TargetBackend
    assert schema.validate_ref is eagle3.validate_ref


def test_schema_for_an_unregistered_or_unknown_algorithm_names_it_and_the_registered_ones() -> None:
    with pytest.raises(
        ValueError, match=r"registered for algorithm 'medusa'.*registered: .*eagle3.*register_algorithm"
    ):
        schemas.schema_for("medusa")
    with pytest.raises(ValueError, match=r"'Medusa!' is not a FeatureAlgorithm"):
        schemas.schema_for("Medusa!")


def test_register_refuses_a_second_schema_for_an_algorithm_and_a_wrong_core_set() -> None:
    schema = schemas.schema_for(FeatureAlgorithm.EAGLE3)
    assert schemas.register(schema) is schema, "registering the same schema again is a no-op"
    with pytest.raises(ValueError, match=r"already registered"):
        schemas.register(dataclasses.replace(schema, schema_version=2))
    with pytest.raises(ValueError, match=r"requires exactly .*'loss_mask'"):
        dataclasses.replace(schema, required_features=CORE[:3])
    with pytest.raises(TypeError, match=r"batch_type dict has no from_tensors\(\)"):
        dataclasses.replace(schema, batch_type=dict)

    class Untrainable:
        from_tensors = dict

    with pytest.raises(TypeError, match=r"batch_type Untrainable has no to_trainer_inputs\(\)"):
        dataclasses.replace(schema, batch_type=Untrainable)
    assert schemas.schema_for(FeatureAlgorithm.EAGLE3) is schema, "a refused registration changes nothing"


def test_reference_classes_count_once_their_module_is_imported_and_never_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    schema = dataclasses.replace(
        eagle3.EAGLE3_SCHEMA, reference_backend_type="refpkg.backend.Base", reference_batch_type="refpkg.target.Batch"
    )

    class Base:
        pass

    class Backend(Base):
        pass

    assert not schema.is_backend(Backend()) and schema.default_batch_type() is Eagle3TargetBatch
    assert "refpkg.backend" not in sys.modules, "looking never imports"
    for name, attribute, value in (("refpkg.backend", "Base", Base), ("refpkg.target", "Batch", RecipeBatch)):
        module = types.ModuleType(name)
        setattr(module, attribute, value)
        monkeypatch.setitem(sys.modules, name, module)
    assert schema.is_backend(Backend()) and not schema.is_backend(object())
    both = schema.default_batch_type()
    assert issubclass(both, Eagle3TargetBatch) and issubclass(both, RecipeBatch) and schema.default_batch_type() is both
    batch = schema.make_batch(eagle3_sample(1), both)
    assert isinstance(batch, RecipeBatch) and "target_logits" in batch.to_trainer_inputs(), "featurestream's methods"
    copied = pickle.loads(pickle.dumps(batch))
    assert type(copied) is both and torch.equal(copied.logits, batch.logits)
    for bad in ("Base", "", ".Base", 3):
        with pytest.raises(ValueError, match=r"reference_backend_type must be a dotted 'module.Class' name"):
            dataclasses.replace(schema, reference_backend_type=bad)


def test_make_batch_uses_from_tensors_when_there_is_one_else_keywords() -> None:
    tensors = eagle3_sample(2)
    built = schemas.make_batch(tensors, RecipeBatch)
    assert isinstance(built, RecipeBatch) and built.logits is tensors["logits"] and built.target_probs is None
    with pytest.raises(ValueError, match=r"no supervision encoding"):
        schemas.make_batch({n: tensors[n] for n in CORE}, Eagle3TargetBatch)  # validated by from_tensors


def _vocab(vocab: int = 10, ids: tuple[int, ...] = (7, 1, 4)) -> DraftVocab:
    mask = torch.zeros(vocab, dtype=torch.bool)
    mask[list(ids)] = True
    return DraftVocab(torch.tensor(ids), mask)


def test_a_draft_vocab_map_is_checked_copied_and_read_from_a_draft_checkpoints_buffers() -> None:
    ids = torch.tensor([7, 1, 4])
    mask = torch.zeros(10, dtype=torch.bool)
    mask[ids] = True
    vocab = DraftVocab(ids, mask)
    ids[0], mask[0] = 0, True  # the caller's tensors change afterwards: the map does not
    assert vocab.selected_token_ids.tolist() == [7, 1, 4] and vocab.selected_token_mask.sum() == 3
    assert (vocab.size, vocab.target_size) == (3, 10)
    # A draft checkpoint stores d2t (target id - draft id) and t2d (the selected target ids).
    again = DraftVocab.from_d2t(torch.tensor([7, 1, 4]) - torch.arange(3), vocab.selected_token_mask)
    assert torch.equal(again.selected_token_ids, vocab.selected_token_ids)
    with pytest.raises(TypeError, match=r"integer token ids, got dtype torch\.float32"):
        DraftVocab.from_d2t(torch.zeros(3), vocab.selected_token_mask)
    with pytest.raises(TypeError, match=r"d2t must be a torch\.Tensor of offsets, got list"):
        DraftVocab.from_d2t([7, 0, 2], vocab.selected_token_mask)  # type: ignore[arg-type]
    good_mask = vocab.selected_token_mask
    for bad_ids, bad_mask, error, match in [
        ([7, 1], good_mask, TypeError, r"selected_token_ids must be a torch\.Tensor, got list"),
        (torch.tensor([7.0, 1.0, 4.0]), good_mask, TypeError, r"integer token ids, got dtype torch\.float32"),
        (torch.tensor([7, 1, 4]), good_mask.long(), TypeError, r"selected_token_mask must be a bool tensor"),
        (torch.tensor([[7, 1, 4]]), good_mask, ValueError, r"selected_token_ids must be a non-empty 1-D tensor"),
        (torch.tensor([7, 1, 12]), good_mask, ValueError, r"\[12\] lie outside the target vocabulary \[0, 10\)"),
        (torch.tensor([7, 1, 1]), good_mask, ValueError, r"repeat a token id \(3 ids, 2 distinct\)"),
        (torch.tensor([7, 1, 5]), good_mask, ValueError, r"True exactly at selected_token_ids; it differs at \[4, 5\]"),
    ]:
        with pytest.raises(error, match=match):
            DraftVocab(bad_ids, bad_mask)  # type: ignore[arg-type]


def test_projection_keeps_the_draft_ids_distribution_and_the_supervised_positions_it_can_predict() -> None:
    vocab = _vocab()
    logits = torch.randn(2, 5, 10, generator=torch.Generator().manual_seed(0))
    logits[0, 0, 7] = logits[0, 1, 2] = logits[0, 2, 4] = 100.0  # top-1: in the draft, outside it, in it
    loss_mask = torch.tensor([[1, 1, 0, 1, 1], [1, 1, 1, 1, 0]])
    probs, position_mask = vocab.project(logits, loss_mask)
    assert probs.dtype == torch.float32 and probs.shape == (2, 5, 3)
    assert torch.allclose(probs, logits[..., [7, 1, 4]].softmax(-1)) and torch.allclose(probs.sum(-1), torch.ones(2, 5))
    assert position_mask.dtype == torch.bool and position_mask.shape == (2, 5, 1)
    in_draft = torch.isin(logits.argmax(-1), torch.tensor([7, 1, 4]))
    assert torch.equal(position_mask[..., 0], in_draft & loss_mask.bool())
    assert position_mask[0, :3, 0].tolist() == [True, False, False], "in the draft; outside it; unsupervised"
    with pytest.raises(ValueError, match=r"logits must be \[batch, tokens, 10\].*got shape \(2, 5, 9\)"):
        vocab.project(logits[..., :9], loss_mask)
    with pytest.raises(ValueError, match=r"loss_mask must be \(2, 5\) like logits' positions, got \(2, 4\)"):
        vocab.project(logits, loss_mask[:, :4])


def test_a_projecting_target_replaces_logits_and_passes_every_other_feature_on() -> None:
    tensors = eagle3_sample(0, vocab=10)
    packing = {
        "position_ids": torch.arange(4)[None],
        "seq_lens": torch.tensor([[4]]),
        "doc_remaining": torch.zeros(1, 4),
    }
    batch = Eagle3TargetBatch.from_tensors({**tensors, **packing})
    projected = project_to_draft_vocab(batch, _vocab())
    assert projected.logits is None and projected.keys() == [*CORE, "target_probs", "position_mask", *PACKING]
    assert all(projected[name] is batch[name] for name in [*CORE, *PACKING])
    with pytest.raises(ValueError, match=r"needs a logits-supervised batch"):
        project_to_draft_vocab(projected, _vocab())

    class Target(eagle3.Eagle3TargetBackend):
        def __init__(self) -> None:
            self.calls: list[dict[str, object]] = []

        def generate_batch(self, **inputs: torch.Tensor | None) -> Eagle3TargetBatch:  # type: ignore[override]
            self.calls.append(inputs)
            return batch

    inner = Target()
    target = DraftVocabTarget(inner)
    with pytest.raises(RuntimeError, match=r"DraftVocabTarget over Target has no draft-vocab map"):
        target.generate_batch(tensors["input_ids"], tensors["attention_mask"], tensors["loss_mask"])
    target.set_vocab_mapping(torch.tensor([7, 1, 4]), _vocab().selected_token_mask)
    with pytest.raises(ValueError, match=r"differs at"):
        target.set_vocab_mapping(torch.tensor([7, 1, 5]), _vocab().selected_token_mask)
    assert target.vocab is not None and target.vocab.selected_token_ids.tolist() == [7, 1, 4], (
        "a refused map changes nothing"
    )
    store = LocalFeatureStore()
    ref = FeatureProducer(target, store, run_id="r").produce(**{n: tensors[n] for n in CORE[1:]}, **packing)
    assert inner.calls[-1].keys() == {"input_ids", "attention_mask", "loss_mask", *PACKING}
    assert list(ref.feature_keys) == [*CORE, "target_probs", "position_mask", *PACKING]
    stored, handle = store.get(ref)
    assert torch.equal(stored["target_probs"], projected.target_probs)
    store.release(handle)
    with pytest.raises(TypeError, match=r"target must have a generate_batch"):
        DraftVocabTarget(object())


def test_the_draft_vocab_encoding_shrinks_the_stored_supervision_by_the_vocabulary_ratio() -> None:
    # A 150k-vocabulary target (Qwen's 151936) and a 32k draft vocabulary, float32 logits: the stored supervision
    # per token goes from V * 4 bytes to D * 4 + 1 (target_probs, position_mask), 4.75x smaller.
    target_vocab, draft, tokens = 151_936, 32_000, 2
    mask = torch.zeros(target_vocab, dtype=torch.bool)
    mask[:draft] = True
    tensors = {**eagle3_sample(0, tokens=tokens), "logits": torch.randn(1, tokens, target_vocab)}
    store = LocalFeatureStore(max_bytes=1 << 30)
    full = store.put("full", tensors)
    projected = store.put("draft", project_to_draft_vocab(tensors, DraftVocab(torch.arange(draft), mask)).tensors())

    def supervision_bytes(ref: object, names: tuple[str, ...]) -> int:
        return sum(ref.feature_specs[name].nbytes for name in names)  # type: ignore[attr-defined]

    logits_bytes = supervision_bytes(full, ("logits",))
    probs_bytes = supervision_bytes(projected, ("target_probs", "position_mask"))
    assert (logits_bytes, probs_bytes) == (tokens * target_vocab * 4, tokens * (draft * 4 + 1))
    assert round(logits_bytes / probs_bytes, 2) == 4.75
    assert full.estimated_bytes - logits_bytes == projected.estimated_bytes - probs_bytes, "the rest is unchanged"


def test_a_backend_without_packing_keywords_gets_the_three_inputs_it_takes_and_refuses_packing() -> None:
    # The reference's RemoteEagle3TargetModel.generate_batch(input_ids, attention_mask, loss_mask) has this shape.
    tensors = eagle3_sample(0)

    class ThreeInputs(eagle3.Eagle3TargetBackend):
        def __init__(self) -> None:
            self.calls: list[tuple[torch.Tensor, ...]] = []

        def generate_batch(  # type: ignore[override]
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor
        ) -> dict[str, torch.Tensor]:
            self.calls.append((input_ids, attention_mask, loss_mask))
            return {name: tensor.clone() for name, tensor in tensors.items()}

    target, store = ThreeInputs(), LocalFeatureStore()
    producer = FeatureProducer(target, store, run_id="r")
    inputs = {name: tensors[name] for name in ("input_ids", "attention_mask", "loss_mask")}
    assert list(producer.produce(**inputs).feature_keys) == list(tensors)
    packing = {
        "position_ids": torch.arange(4)[None],
        "seq_lens": torch.tensor([[4]]),
        "doc_remaining": torch.zeros(1, 4),
    }
    with pytest.raises(
        ValueError, match=r"ThreeInputs\.generate_batch takes no packing metadata, but \['position_ids'"
    ):
        producer.produce(**inputs, **packing)
    assert len(target.calls) == 1 and store.health().sample_count == 1, "refused before the forward, nothing stored"
