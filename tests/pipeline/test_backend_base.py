"""The algorithms' backend base classes: a backend writes ``generate_batch`` itself (the reference's form, as its
wrappers and existing recipes do) or ``target_batch`` (the six arguments in one ``TargetInputs``); either is
instantiable and streams through ``FeatureProducer`` with its algorithm inferred from the base; one with neither is
abstract and refused on instantiation; the library's backends keep the reference's ``generate_batch`` parameters."""

from __future__ import annotations

import inspect
import typing
from typing import Any

import pytest
import torch

from featurestream import (
    DFlashTargetBackend,
    DFlashTargetBatch,
    DSparkTargetBackend,
    DSparkTargetBatch,
    Eagle3TargetBackend,
    Eagle3TargetBatch,
    EagleTargetBackend,
    EagleTargetBatch,
    FeatureAlgorithm,
    FeatureProducer,
    LocalFeatureStore,
)
from featurestream.pipeline.eagle3 import DraftVocabTarget, Eagle3ForwardBackend
from featurestream.pipeline.features import TargetBackendBase, TargetInputs
from featurestream.tools.models import TinyDFlashTarget, TinyDSparkTarget, TinyTargetModel
from support.algorithm_samples import packing, sample_of

BASES: dict[FeatureAlgorithm, tuple[type[TargetBackendBase], type]] = {
    FeatureAlgorithm.DFLASH: (DFlashTargetBackend, DFlashTargetBatch),
    FeatureAlgorithm.DSPARK: (DSparkTargetBackend, DSparkTargetBatch),
    FeatureAlgorithm.EAGLE: (EagleTargetBackend, EagleTargetBatch),
    FeatureAlgorithm.EAGLE3: (Eagle3TargetBackend, Eagle3TargetBatch),
}
REFERENCE_PARAMETERS = [
    "self", "input_ids", "attention_mask", "loss_mask", "position_ids", "seq_lens", "doc_remaining",
]  # fmt: skip


def prompt(index: int) -> dict[str, torch.Tensor]:
    """The inputs of sample ``index``, packed (the tensors a backend passes through are the sample's own)."""
    sample = sample_of(FeatureAlgorithm.DFLASH, index)
    inputs = {name: sample[name] for name in ("input_ids", "attention_mask", "loss_mask")}
    return {**inputs, **packing()}


@pytest.mark.parametrize("algorithm", list(BASES), ids=str)
def test_a_backend_writing_generate_batch_itself_is_instantiable_and_streams(algorithm: FeatureAlgorithm) -> None:
    base, batch_type = BASES[algorithm]

    class Direct(base):  # type: ignore[valid-type,misc]
        def generate_batch(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor, **packed: Any
        ) -> Any:
            return batch_type(**sample_of(algorithm, int(input_ids[0, 0]) // 100))

    assert not inspect.isabstract(Direct)
    ref = FeatureProducer(Direct(), LocalFeatureStore(), run_id="r").produce(**prompt(3))
    assert ref.algorithm is algorithm and list(ref.feature_keys) == list(sample_of(algorithm, 3))


@pytest.mark.parametrize("algorithm", list(BASES), ids=str)
def test_a_backend_writing_neither_method_is_abstract_and_refused(algorithm: FeatureAlgorithm) -> None:
    base, _ = BASES[algorithm]

    class Nothing(base):  # type: ignore[valid-type,misc]
        def get_input_embeddings(self) -> torch.nn.Module:
            return torch.nn.Identity()

    assert inspect.isabstract(Nothing) and inspect.isabstract(base)
    with pytest.raises(TypeError, match=r"Can't instantiate abstract class Nothing.*generate_batch"):
        Nothing()

    class Later(Nothing):
        """A subclass of an abstract one owes the method as much."""

    with pytest.raises(TypeError, match=r"generate_batch"):
        Later()


@pytest.mark.parametrize("algorithm", list(BASES), ids=str)
def test_a_backend_writing_target_batch_gets_the_six_arguments_bundled(algorithm: FeatureAlgorithm) -> None:
    base, batch_type = BASES[algorithm]
    seen: list[TargetInputs] = []

    class Bundled(base):  # type: ignore[valid-type,misc]
        def target_batch(self, inputs: TargetInputs) -> Any:
            seen.append(inputs)
            sample = sample_of(algorithm, int(inputs.input_ids[0, 0]) // 100)
            return inputs.batch(batch_type, **{name: sample[name] for name in sample if name not in given})

    given = prompt(2)
    backend = Bundled()
    ref = FeatureProducer(backend, LocalFeatureStore(), run_id="r").produce(**given)
    assert ref.algorithm is algorithm
    assert set(ref.feature_keys) == set(sample_of(algorithm, 2)) | set(packing())
    for name, tensor in given.items():
        assert getattr(seen[0], name) is tensor, f"{name} reached target_batch as it was given"
    positional = backend.generate_batch(given["input_ids"], given["attention_mask"], given["loss_mask"])
    assert seen[1].loss_mask is given["loss_mask"] and positional.loss_mask is given["loss_mask"]
    assert seen[1].position_ids is None and seen[1].doc_remaining is None and positional.seq_lens is None


def test_target_inputs_batch_passes_through_only_the_fields_the_batch_has_and_what_is_given_wins() -> None:
    given = prompt(1)
    inputs = TargetInputs(
        given["input_ids"],
        given["attention_mask"],
        given["position_ids"],
        given["seq_lens"],
        loss_mask=given["loss_mask"],
        doc_remaining=given["doc_remaining"],
    )
    sample = sample_of(FeatureAlgorithm.DSPARK, 1)
    shifted = torch.zeros_like(given["input_ids"])
    batch = inputs.batch(
        DSparkTargetBatch,
        target_hidden_states=sample["target_hidden_states"],
        target_last_hidden_states=sample["target_last_hidden_states"],
        input_ids=shifted,
    )
    assert batch.input_ids is shifted and batch.loss_mask is given["loss_mask"]
    assert batch.seq_lens is given["seq_lens"] and not hasattr(batch, "attention_mask")
    with pytest.raises(TypeError, match="loss_mask"):
        TargetInputs(given["input_ids"], given["attention_mask"])  # type: ignore[call-arg]


@pytest.mark.parametrize(
    "backend",
    [
        DraftVocabTarget,
        Eagle3ForwardBackend,
        TinyTargetModel,
        TinyDFlashTarget,
        TinyDSparkTarget,
        *(base for base, _ in BASES.values()),
    ],
    ids=lambda backend: backend.__name__,
)
def test_every_library_backend_keeps_the_references_generate_batch_parameters(backend: type) -> None:
    # The Hugging Face wrappers' parameters are compared with the reference's own in tests/compat.
    assert list(inspect.signature(backend.generate_batch).parameters) == REFERENCE_PARAMETERS


@pytest.mark.parametrize("algorithm", list(BASES), ids=str)
def test_each_algorithms_base_names_its_batch_class_for_type_checkers(algorithm: FeatureAlgorithm) -> None:
    base, batch_type = BASES[algorithm]
    assert [typing.get_args(parent) for parent in base.__orig_bases__] == [(batch_type,)]


def test_target_batch_of_a_backend_writing_generate_batch_itself_says_so() -> None:
    class Direct(DSparkTargetBackend):
        def generate_batch(self, **inputs: Any) -> Any:
            return None

    given = prompt(0)
    inputs = TargetInputs(given["input_ids"], given["attention_mask"], loss_mask=given["loss_mask"])
    with pytest.raises(NotImplementedError, match=r"Direct implements generate_batch itself, not target_batch"):
        Direct().target_batch(inputs)
