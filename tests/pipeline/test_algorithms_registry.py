"""Open registration: a user algorithm's name, features and batch class; collisions and malformed ones refused."""

from __future__ import annotations

import dataclasses
import re
import threading
import uuid

import pytest
import torch

from featurestream import (
    FeatureAlgorithm,
    FeatureDataLoader,
    FeatureRule,
    LocalFeatureStore,
    SampleRef,
    SampleRefQueue,
    register_algorithm,
)
from featurestream.common.refs import required_features, resolve_algorithm
from featurestream.pipeline import FeatureBatch, FeatureSet, schema_for


def batch_class(name: str) -> type[FeatureBatch]:
    """A user's batch class for algorithm ``name``: one required hidden state and token ids, optional logits."""

    @dataclasses.dataclass
    class UserBatch(FeatureBatch):
        FEATURES = FeatureSet(
            name,
            (
                FeatureRule("hidden", ("floating",), ("B", "S", "*")),
                FeatureRule("input_ids", ("integer",), ("B", "S")),
                FeatureRule("logits", ("floating",), ("B", "S", "*"), required=False),
            ),
        )

        hidden: torch.Tensor
        input_ids: torch.Tensor
        logits: torch.Tensor | None = None

    return UserBatch


def fresh(name: str) -> str:
    """``name`` made unique to this call: the registry is the process's, and a test may run twice in one process."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def user_sample(index: int) -> dict[str, torch.Tensor]:
    return {"hidden": torch.full((1, 3, 2), float(index)), "input_ids": torch.arange(3).reshape(1, 3) + index}


def test_a_registered_algorithm_streams_through_queue_and_loader_and_its_core_set_reaches_the_control_plane() -> None:
    name = fresh("test.streams")
    batch_type = batch_class(name)
    schema = register_algorithm(name, batch_type)
    assert schema.algorithm == name and schema_for(name) is schema
    assert required_features(name) == ("hidden", "input_ids")
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    queue.put(store.put("u0", user_sample(0), run_id="r", algorithm=name))
    with pytest.raises(
        ValueError, match=rf"SampleRef for {re.escape(name)} is missing required features \['input_ids'\]"
    ):
        store.put("u1", {"hidden": user_sample(1)["hidden"]}, run_id="r", algorithm=name)
    queue.close()
    with FeatureDataLoader(queue, store, algorithm=name, prefetch=0) as loader:
        (batch,) = list(loader)
    assert type(batch) is batch_type and torch.equal(batch.hidden, user_sample(0)["hidden"])


@pytest.mark.parametrize("builtin", [a.value for a in FeatureAlgorithm])
def test_a_registration_colliding_with_a_builtin_name_is_refused(builtin: str) -> None:
    with pytest.raises(ValueError, match=rf"algorithm name '{builtin}' collides with the built-in"):
        register_algorithm(builtin, batch_class(builtin))
    assert schema_for(builtin).batch_type is not None and schema_for(builtin).algorithm is FeatureAlgorithm(builtin)


def test_a_second_registration_of_a_name_and_malformed_ones_are_refused_and_change_nothing() -> None:
    name = fresh("test.twice")
    batch_type = batch_class(name)
    first = register_algorithm(name, batch_type)
    assert register_algorithm(name, batch_type) is first, "the same class again (a notebook cell re-run): a no-op"
    with pytest.raises(ValueError, match=rf"schema for '{re.escape(name)}' is already registered"):
        register_algorithm(name, batch_class(name))  # another class of the same name
    with pytest.raises(ValueError, match=rf"schema for '{re.escape(name)}' is already registered"):
        register_algorithm(name, batch_type, schema_version=2)  # the same class, another version
    assert schema_for(name) is first
    for bad in ("Upper", "has space", "", "a" * 65, "trailing.", "1digit"):
        with pytest.raises(ValueError, match=r"is not a FeatureAlgorithm .* nor a well-formed algorithm name"):
            register_algorithm(bad, batch_class("x"))
    with pytest.raises(TypeError, match=r"batch_type must be a FeatureBatch subclass"):
        register_algorithm("test.nobatch", dict)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"backend_type must be a class or None"):
        register_algorithm("test.nobackend", batch_class("test.nobackend"), backend_type="Backend")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"no feature schema is registered for algorithm 'test.nobatch'"):
        schema_for("test.nobatch")
    store = LocalFeatureStore()
    with pytest.raises(ValueError, match=r"algorithm 'test.nobatch' in this process .*register_algorithm\(\.\.\.\)"):
        FeatureDataLoader(SampleRefQueue(store), store, algorithm="test.nobatch")


def test_a_ref_of_an_algorithm_this_process_never_declared_is_built_unchecked_and_names_it_on_the_wire() -> None:
    from featurestream.backends.redis.wire import ref_from_json, ref_to_json

    ref = LocalFeatureStore().put("z", user_sample(0), run_id="r", algorithm="test.elsewhere")
    assert isinstance(ref, SampleRef) and ref.algorithm == "test.elsewhere" and type(ref.algorithm) is str
    assert resolve_algorithm("dflash") is FeatureAlgorithm.DFLASH
    assert '"algorithm":"test.elsewhere"' in ref_to_json(ref) and ref_from_json(ref_to_json(ref)) == ref


def test_malformed_rules_and_feature_sets_are_refused_naming_the_value() -> None:
    with pytest.raises(ValueError, match=r"dtype 'complex' is neither a torch.dtype nor a kind"):
        FeatureRule("x", ("complex",), ("B",))
    with pytest.raises(ValueError, match=r"shape \('B', -1\) has dimension -1"):
        FeatureRule("x", ("floating",), ("B", -1))
    with pytest.raises(ValueError, match=r"name must be an identifier, got 'not a name'"):
        FeatureRule("not a name", ("floating",), ())
    with pytest.raises(ValueError, match=r"'x' requires 'y', which is not another feature"):
        FeatureSet("t", (FeatureRule("x", ("floating",), (), requires=("y",)),))
    with pytest.raises(ValueError, match=r"t features repeat a name"):
        FeatureSet("t", (FeatureRule("x", ("floating",), ()), FeatureRule("x", ("integer",), ())))
    rule = FeatureRule("x", (torch.float16, "integer"), (2, "S"))
    assert torch.float16 in rule.admitted and torch.int64 in rule.admitted and torch.float32 not in rule.admitted
    with pytest.raises(
        ValueError, match=r"sample 's': t feature 'x' expected shape \[2, S\] .* \(dimension 0 must be 2\)"
    ):
        FeatureSet("t", (rule,)).check_specs({"x": ((3, 4), torch.int64)}, "s")


def test_concurrent_registrations_of_one_name_leave_exactly_one_schema() -> None:
    name = fresh("test.race")
    classes = [batch_class(name) for _ in range(8)]
    barrier = threading.Barrier(len(classes))
    outcomes: list[object] = []

    def attempt(batch_type: type[FeatureBatch]) -> None:
        barrier.wait()
        try:
            outcomes.append(register_algorithm(name, batch_type))
        except ValueError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=attempt, args=(batch_type,)) for batch_type in classes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    won = [outcome for outcome in outcomes if not isinstance(outcome, ValueError)]
    assert len(won) == 1 and schema_for(name) is won[0] and len(outcomes) == len(classes)
