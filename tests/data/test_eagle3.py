"""The EAGLE-3 v1 schema, Eagle3TargetBatch, and the algorithm schema registry."""

from __future__ import annotations

import dataclasses
import pickle
import sys
import types

import pytest
import torch

from compat.recipe import RecipeBatch  # a batch class with no from_tensors
from featurestream import Eagle3TargetBatch, FeatureAlgorithm, LocalFeatureStore
from featurestream.core.refs import REQUIRED_FEATURES
from featurestream.pipeline import eagle3, schemas
from featurestream.pipeline.eagle3 import check_feature_names, feature_tensors, validate_ref

from .helpers import eagle3_sample

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


def test_validate_ref_checks_algorithm_version_and_names() -> None:
    store = LocalFeatureStore()
    validate_ref(store.put("ok", eagle3_sample(0)))
    with pytest.raises(ValueError, match=r"'v2': eagle3 schema_version must be 1, got 2"):
        validate_ref(store.put("v2", eagle3_sample(0), schema_version=2))
    with pytest.raises(ValueError, match=r"'nologits'.*no supervision encoding"):
        validate_ref(store.put("nologits", {n: t for n, t in eagle3_sample(0).items() if n != "logits"}))
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
    assert schema.validate_ref is eagle3.validate_eagle3_ref


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
