"""The hidden-state encoding's checks: the ref names it, the wrong head or no head is refused and failed back."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch

pytest.importorskip(
    "transformers", reason="the hidden-supervision tests need transformers: pip install 'featurestream[hf]'"
)

from featurestream.backends.memory.queue import SampleRefQueue
from featurestream.backends.redis.wire import ref_from_json, ref_to_json
from featurestream.common.refs import FeatureAlgorithm, FeatureSpec, SampleRef
from featurestream.pipeline.hf import HFDFlashTargetModel, HFEagle3TargetModel, HFEagleTargetModel
from featurestream.pipeline.loader import FeatureDataLoader
from featurestream.pipeline.producer import FeatureProducer
from featurestream.pipeline.supervision import HiddenSupervised
from featurestream.pipeline.target_head import TargetHead
from featurestream.stores.local import LocalFeatureStore
from support.tiny import prompts, tiny_model

AUX = (1, 3, 4)


def produced(model: torch.nn.Module) -> tuple[SampleRefQueue, LocalFeatureStore, SampleRef]:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    input_ids, attention_mask, loss_mask = prompts()
    producer = FeatureProducer(HFEagle3TargetModel(model, AUX, supervision="hidden"), store, run_id="r")
    ref = producer.produce(input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask)
    queue.put(ref)
    return queue, store, ref


def test_the_ref_names_the_encoding_and_the_heads_fingerprint() -> None:
    model = tiny_model("llama", layers=5)
    _, _, ref = produced(model)
    head = TargetHead.from_model(model)
    assert dict(ref.provenance or {}) == {"supervision": "hidden", "target_head": head.fingerprint}
    assert "logits" not in ref.feature_specs
    assert ref.feature_specs["last_hidden_states"] == FeatureSpec((2, 12, 32), torch.float32)
    # It crosses process boundaries intact, and a ref without provenance is encoded as before.
    assert ref_from_json(ref_to_json(ref)) == ref and pickle.loads(pickle.dumps(ref)) == ref
    plain = SampleRef(
        **{**{f: getattr(ref, f) for f in ("sample_id", "run_id", "store_uri", "algorithm")}, **_logits_fields(ref)}
    )
    assert "provenance" not in ref_to_json(plain) and plain.provenance == {}


def _logits_fields(ref: SampleRef) -> dict[str, Any]:
    specs = {name: spec for name, spec in ref.feature_specs.items() if name != "last_hidden_states"}
    specs["logits"] = FeatureSpec((2, 12, 128), torch.float32)
    return {
        "feature_keys": {name: name for name in specs},
        "feature_specs": specs,
        "schema_version": 1,
        "num_tokens": 3,
        "estimated_bytes": 1,
        "target_model_version": "0",
        "draft_weight_version": "0",
    }


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"provenance": {"supervision": "fp4", "target_head": "x"}}, "supervision='fp4' is not an encoding"),
        ({"provenance": {"supervision": "hidden"}}, "with the head's fingerprint"),
        ({"algorithm": FeatureAlgorithm.DSPARK}, "not an encoding of dspark"),
        ({"drop": "last_hidden_states"}, "carries 'last_hidden_states' and no 'logits'"),
        ({"add": "logits"}, "carries 'last_hidden_states' and no 'logits'"),
        (
            {"provenance": {"supervision": "hidden", "target_head": "h", "note": 3}},
            r"provenance\['note'\] must be a str",
        ),
    ],
)
def test_a_ref_with_a_broken_encoding_is_refused(change: dict[str, Any], match: str) -> None:
    model = tiny_model("llama", layers=5)
    _, _, ref = produced(model)
    fields = {f: getattr(ref, f) for f in SampleRef.__dataclass_fields__}
    fields["feature_keys"], fields["feature_specs"] = dict(ref.feature_keys), dict(ref.feature_specs)
    if "drop" in change:
        del fields["feature_keys"][change["drop"]], fields["feature_specs"][change["drop"]]
    elif "add" in change:
        fields["feature_keys"]["logits"] = "k"
        fields["feature_specs"]["logits"] = FeatureSpec((2, 12, 128), torch.float32)
    else:
        fields.update(change)
        if change.get("algorithm") is FeatureAlgorithm.DSPARK:
            fields["feature_specs"] = {"target_hidden_states": ref.feature_specs["aux_hidden_states"]}
            fields["feature_specs"] |= {"target_last_hidden_states": ref.feature_specs["last_hidden_states"]}
            fields["feature_specs"] |= {n: ref.feature_specs[n] for n in ("input_ids", "loss_mask")}
            fields["feature_keys"] = {name: name for name in fields["feature_specs"]}
    with pytest.raises(ValueError, match=match):
        SampleRef(**fields)


def test_a_loader_without_a_head_says_to_pass_one_and_fails_the_sample_back() -> None:
    model = tiny_model("llama", layers=5)
    queue, store, _ = produced(model)
    with FeatureDataLoader(queue, store, prefetch=0, close_queue=False) as loader:
        with pytest.raises(ValueError, match=r"carries the target's last hidden state.*pass target_head=") as error:
            next(loader)
    assert "redelivered, not acked" in str(error.value)
    stats = queue.stats()
    assert (stats.acked, queue.pending_count()) == (0, 1)  # failed back: the next consumer gets it
    with FeatureDataLoader(queue, store, prefetch=2, target_head=TargetHead.from_model(model)) as loader:
        queue.close()
        (batch,) = list(loader)
    assert batch.logits.shape == (2, 12, 128) and queue.stats().acked == 1


@pytest.mark.parametrize("other", ["model", "vocabulary", "dtype"])
def test_a_head_of_another_target_is_refused_at_the_first_batch_naming_both(other: str) -> None:
    model = tiny_model("llama", layers=5)
    queue, store, _ = produced(model)
    right = TargetHead.from_model(model)
    wrong = {
        "model": lambda: TargetHead.from_model(tiny_model("llama", layers=5, seed=1)),
        "vocabulary": lambda: TargetHead(right.weight[:100]),
        "dtype": lambda: TargetHead(right.weight.to(torch.bfloat16)),
    }[other]()
    with FeatureDataLoader(queue, store, target_head=wrong, close_queue=False) as loader:
        with pytest.raises(ValueError, match="another model, vocabulary or dtype") as error:
            next(loader)
    assert right.fingerprint in str(error.value) and wrong.fingerprint in str(error.value)
    assert (queue.stats().acked, queue.pending_count()) == (0, 1)


def test_no_lm_head_runs_on_the_producer() -> None:
    model = tiny_model("qwen3", layers=5)
    calls: list[int] = []
    model.lm_head.register_forward_hook(lambda *args: calls.append(1))
    input_ids, attention_mask, loss_mask = prompts()
    for target in (
        HFEagle3TargetModel(model, AUX, supervision="hidden"),
        HFEagleTargetModel(model, supervision="hidden"),
        HFDFlashTargetModel(model, [1, 2], capture_logits=True, supervision="hidden"),
    ):
        batch = target.generate_batch(input_ids, attention_mask, loss_mask)
        assert isinstance(batch, HiddenSupervised)
    assert calls == []
    HFEagle3TargetModel(model, AUX).generate_batch(input_ids, attention_mask, loss_mask)
    assert calls == [1]  # the hook would have seen it


def test_the_producer_checks_a_hidden_supervised_batch_and_stores_nothing_it_refuses() -> None:
    model = tiny_model("llama", layers=5)
    head = TargetHead.from_model(model)
    input_ids, attention_mask, loss_mask = prompts()
    good = HFEagle3TargetModel(model, AUX, supervision="hidden").generate_batch(input_ids, attention_mask, loss_mask)

    class Returning(HFEagle3TargetModel):
        def __init__(self, batch: HiddenSupervised) -> None:
            self.batch = batch

        def generate_batch(self, **inputs: Any) -> Any:
            return self.batch

    cases = [
        ({**good.features, "logits": torch.zeros(2, 12, 128)}, head, "carries the tensor 'last_hidden_states' and no"),
        ({**good.features, "last_hidden_states": torch.zeros(2, 12, 16)}, head, r"takes \[\.\.\., 32\]"),
        ({**good.features, "last_hidden_states": torch.zeros(2, 11, 32)}, head, "S=12"),
        (good.features, TargetHead(head.weight.to(torch.bfloat16)), "takes .* torch.bfloat16"),
    ]
    for features, given_head, match in cases:
        store = LocalFeatureStore()
        producer = FeatureProducer(Returning(HiddenSupervised(features, given_head)), store, run_id="r")
        with pytest.raises(ValueError, match=match):
            producer.produce(input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask)
        assert store.health().sample_count == 0


def test_the_wrappers_refuse_an_unknown_supervision() -> None:
    model = tiny_model("llama", layers=5)
    with pytest.raises(ValueError, match=r"supervision must be 'logits'.*or 'hidden'.*got 'probs'"):
        HFEagle3TargetModel(model, AUX, supervision="probs")
    with pytest.raises(ValueError, match="needs capture_logits=True"):
        HFDFlashTargetModel(model, [1], supervision="hidden")
