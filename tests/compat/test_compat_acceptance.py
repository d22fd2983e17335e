"""What the reference accepts, featurestream accepts: side by side with the installed reference package.

A ``SampleRef``, every store's ``put`` and the queue's ``put`` hold a sample to
the reference's rule alone (its algorithm's required features, whatever else
it carries or lacks, supervision included); ``validate_eagle3_ref`` judges a
ref by its names and schema version alone, as the reference's does, so 2-D
hidden states pass it. Where featurestream's loader refuses a sample the
reference's loader refuses too, both leave nothing pending or leased; the
reference acks it, featurestream dead-letters it (reason ``schema``). A
feature of a recipe's own both loaders pass over.
"""

from __future__ import annotations

import dataclasses
import importlib
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from .conftest import Reference
from .recipe import sample_tensors

CORE = ("aux_hidden_states", "input_ids", "attention_mask", "loss_mask")
PAIR = ("target_probs", "position_mask")

# Feature sets a recipe, an offline tool or a test might store, by name; the algorithm each is stored as.
FEATURE_SETS: dict[str, tuple[str, tuple[str, ...]]] = {
    "core-only": ("EAGLE3", CORE),
    "logits": ("EAGLE3", (*CORE, "logits")),
    "draft-vocab": ("EAGLE3", (*CORE, *PAIR)),
    "half-pair": ("EAGLE3", (*CORE, "target_probs")),
    "both-encodings": ("EAGLE3", (*CORE, "logits", *PAIR)),
    "own-feature": ("EAGLE3", (*CORE, "logits", "prompt_len")),
    "partial-packing": ("EAGLE3", (*CORE, "logits", "seq_lens")),
    "no-loss-mask": ("EAGLE3", (*CORE[:3], "logits")),
    "dflash": ("DFLASH", ("hidden_states", "input_ids", "attention_mask", "loss_mask")),
    "dflash-no-hidden": ("DFLASH", ("input_ids", "attention_mask", "loss_mask")),
}

# The phrase of each of the reference validator's refusals, which featurestream's message must contain too.
VALIDATOR_PHRASES = (
    "for an EAGLE-3 consumer",
    "missing required core features",
    "position_ids, seq_lens, and doc_remaining together",
    "partial draft-vocab encoding",
    "both 'logits' and draft-vocab features",
    "no supervision encoding",
    "schema_version must be",
)


def _side(load: Callable[[str], types.ModuleType]) -> types.SimpleNamespace:
    names = {"refs": "refs", "local": "stores.local", "shared_dir": "stores.shared_dir", "queue": "queue"}
    names |= {"eagle3": "eagle3", "loader": "loader"}
    return types.SimpleNamespace(**{attr: load(module) for attr, module in names.items()})


@pytest.fixture
def sides(reference: Reference) -> dict[str, types.SimpleNamespace]:
    """featurestream's modules and the reference's, under the same names (a recipe's two possible imports)."""
    return {
        "featurestream": _side(lambda name: importlib.import_module(f"featurestream.{name}")),
        "reference": _side(reference.module),
    }


def _tensors(names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """2-D tensors for every feature (as the reference's own tests store them), 3-D logits."""
    return {name: torch.zeros(2, 8, 32) if name == "logits" else torch.zeros(2, 8) for name in names}


def _outcome(action: Callable[[], object]) -> str:
    """``ok``, or the name of the exception ``action`` raised."""
    try:
        action()
    except Exception as exc:  # the type is the outcome compared
        return type(exc).__name__
    return "ok"


def _put_kwargs(side: types.SimpleNamespace, algorithm: str) -> dict[str, Any]:
    return {
        "run_id": "r1",
        "algorithm": getattr(side.refs.FeatureAlgorithm, algorithm),
        "schema_version": 1,
        "target_model_version": "0",
        "draft_weight_version": "0",
        "num_tokens": 16,
    }


@pytest.mark.parametrize("case", FEATURE_SETS)
def test_sample_ref_accepts_what_the_references_accepts(sides: dict[str, types.SimpleNamespace], case: str) -> None:
    algorithm, names = FEATURE_SETS[case]

    def build(side: types.SimpleNamespace) -> object:
        spec = side.refs.FeatureSpec(shape=(2, 8), dtype=torch.float32)
        return side.refs.SampleRef(
            sample_id="s1",
            run_id="r1",
            store_uri="mem://compat",
            feature_keys={name: f"s1/{name}" for name in names},
            feature_specs=dict.fromkeys(names, spec),
            algorithm=getattr(side.refs.FeatureAlgorithm, algorithm),
            schema_version=1,
            num_tokens=16,
            estimated_bytes=64,
            target_model_version="0",
            draft_weight_version="0",
        )

    outcomes = {name: _outcome(lambda side=side: build(side)) for name, side in sides.items()}
    assert outcomes["featurestream"] == outcomes["reference"], outcomes


def _store_then_queue(
    side: types.SimpleNamespace, store_kind: str, directory: Path, algorithm: str, names: tuple[str, ...]
) -> tuple[str, str, int]:
    """Put a sample of ``names`` into a fresh store of ``store_kind``, then its ref into a queue: each step's
    outcome and what the queue then holds."""
    caps = {"max_samples": 8, "max_bytes": 1 << 20}
    if store_kind == "local":
        store = side.local.LocalFeatureStore(**caps)
    else:
        store = side.shared_dir.SharedDirFeatureStore(str(directory), **caps)
    refs: list[object] = []
    stored = _outcome(lambda: refs.append(store.put("s1", _tensors(names), **_put_kwargs(side, algorithm))))
    queue = side.queue.SampleRefQueue(store)
    queued = _outcome(lambda: queue.put(refs[0])) if refs else "not stored"
    held = queue.pending_count()
    store.close()
    return stored, queued, held


@pytest.mark.parametrize("store_kind", ["local", "shared_dir"])
@pytest.mark.parametrize("case", FEATURE_SETS)
def test_store_put_and_queue_put_accept_what_the_references_accept(
    sides: dict[str, types.SimpleNamespace], case: str, store_kind: str, tmp_path: Path
) -> None:
    algorithm, names = FEATURE_SETS[case]
    outcomes = {
        name: _store_then_queue(side, store_kind, tmp_path / name, algorithm, names) for name, side in sides.items()
    }
    assert outcomes["featurestream"] == outcomes["reference"], outcomes


def _forged_ref(side: types.SimpleNamespace, names: tuple[str, ...], algorithm: str, **fields: object) -> object:
    """A ref built past its constructor (as one unpickled from elsewhere could be): only the validator judges it."""
    ref = object.__new__(side.refs.SampleRef)
    values = {
        "sample_id": "s1",
        "run_id": "r1",
        "store_uri": "mem://compat",
        "feature_keys": {name: f"s1/{name}" for name in names},
        "feature_specs": {
            name: side.refs.FeatureSpec(shape=(2, 8), dtype=torch.long if "ids" in name else torch.float32)
            for name in names
        },
        "algorithm": getattr(side.refs.FeatureAlgorithm, algorithm),
        "schema_version": 1,
        "num_tokens": 16,
        "estimated_bytes": 64,
        "target_model_version": "0",
        "draft_weight_version": "0",
    }
    # Fields one side adds beyond the reference's eleven (featurestream's provenance) take their defaults.
    for field in dataclasses.fields(side.refs.SampleRef):
        if field.name not in values and field.default is not dataclasses.MISSING:
            values[field.name] = field.default
        elif field.name not in values and field.default_factory is not dataclasses.MISSING:
            values[field.name] = field.default_factory()
    for field, value in {**values, **fields}.items():
        object.__setattr__(ref, field, value)
    return ref


@pytest.mark.parametrize("schema_version", [1, 2])
@pytest.mark.parametrize("case", FEATURE_SETS)
def test_validate_eagle3_ref_judges_as_the_references_does(
    sides: dict[str, types.SimpleNamespace], case: str, schema_version: int
) -> None:
    algorithm, names = FEATURE_SETS[case]
    errors: dict[str, str] = {}
    for name, side in sides.items():
        try:
            side.eagle3.validate_eagle3_ref(_forged_ref(side, names, algorithm, schema_version=schema_version))
        except ValueError as exc:
            errors[name] = str(exc)
    assert errors.keys() in ({"featurestream", "reference"}, set()), errors
    if errors:
        [phrase] = [phrase for phrase in VALIDATOR_PHRASES if phrase in errors["reference"]]
        assert phrase in errors["featurestream"], errors


def test_a_sample_both_loaders_refuse_leaves_nothing_queued_and_featurestream_keeps_it_as_a_dead_letter(
    sides: dict[str, types.SimpleNamespace],
) -> None:
    unsupervised = {name: tensor for name, tensor in sample_tensors(0).items() if name != "logits"}
    counts = {}
    for name, side in sides.items():
        store = side.local.LocalFeatureStore(max_samples=8, max_bytes=1 << 20)
        queue = side.queue.SampleRefQueue(store)
        queue.put(store.put("bad", unsupervised, **_put_kwargs(side, "EAGLE3")))
        queue.put(store.put("good", sample_tensors(1), **_put_kwargs(side, "EAGLE3")))
        loader = side.loader.FeatureDataLoader(queue, store)
        with pytest.raises(ValueError, match="no supervision encoding"):
            next(iter(loader))
        assert torch.equal(next(iter(loader)).logits, sample_tensors(1)["logits"]), "the loader carries on"
        loader.close()
        counts[name] = (queue.pending_count(), queue.outstanding_count())
        if name == "featurestream":
            stats = queue.stats()
            assert (stats.acked, stats.dead_lettered) == (1, 1), "never counted as trained"
            [letter] = queue.dead_letters()
            assert letter.ref.sample_id == "bad" and letter.reason.startswith("schema: sample 'bad': ")
    assert counts["featurestream"] == counts["reference"] == (0, 0)


def test_a_recipes_own_feature_is_passed_over_by_both_loaders_and_reaches_a_collate_fn(
    sides: dict[str, types.SimpleNamespace],
) -> None:
    tensors = {**sample_tensors(0), "prompt_len": torch.tensor([6])}
    for name, side in sides.items():
        store = side.local.LocalFeatureStore(max_samples=8, max_bytes=1 << 20)
        queue = side.queue.SampleRefQueue(store)
        queue.put(store.put("own", tensors, **_put_kwargs(side, "EAGLE3")))
        loader = side.loader.FeatureDataLoader(queue, store)
        batch = next(iter(loader))
        assert torch.equal(batch.logits, tensors["logits"]) and not hasattr(batch, "prompt_len"), name
        loader.close()
    store = sides["featurestream"].local.LocalFeatureStore()
    queue = sides["featurestream"].queue.SampleRefQueue(store)
    queue.put(store.put("own", tensors, **_put_kwargs(sides["featurestream"], "EAGLE3")))
    with sides["featurestream"].loader.FeatureDataLoader(queue, store, collate_fn=lambda samples: samples) as loader:
        [sample] = next(iter(loader))
    assert torch.equal(sample["prompt_len"], tensors["prompt_len"])


def test_forged_refs_carry_every_field(sides: dict[str, types.SimpleNamespace]) -> None:
    # The forged refs above set every field of each side's SampleRef, so the validators see whole refs.
    for side in sides.values():
        fields = {field.name for field in dataclasses.fields(side.refs.SampleRef)}
        assert fields <= set(vars(_forged_ref(side, CORE, "EAGLE3")))
