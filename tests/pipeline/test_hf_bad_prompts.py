"""A prompt that is no ``[batch, tokens]`` batch is refused by the producer before the forward, in its own words.

Before, 1-D ``input_ids`` reached the model and ended in an ``IndexError`` inside transformers.
"""

from __future__ import annotations

import pytest

from featurestream import FeatureProducer, LocalFeatureStore
from featurestream.pipeline.hf import HFEagle3TargetModel
from support.tiny import prompts, tiny_model


def test_one_dimensional_input_ids_and_mismatched_masks_are_refused_before_the_forward() -> None:
    model = tiny_model("llama")
    forwards: list[int] = []
    model.register_forward_pre_hook(lambda module, args: forwards.append(1))
    store = LocalFeatureStore()
    producer = FeatureProducer(HFEagle3TargetModel(model), store, run_id="run")
    input_ids, attention_mask, loss_mask = prompts(batch=1, length=8)
    with pytest.raises(ValueError, match=r"input_ids must be \[batch, tokens\], got shape \(8,\) \(add the batch"):
        producer.produce(input_ids=input_ids[0], attention_mask=attention_mask[0], loss_mask=loss_mask[0])
    with pytest.raises(ValueError, match=r"loss_mask has shape \(1, 7\) but input_ids \(1, 8\)"):
        producer.produce(input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask[:, :7])
    with pytest.raises(TypeError, match=r"attention_mask must be a torch.Tensor of shape \[batch, tokens\], got list"):
        producer.produce(input_ids=input_ids, attention_mask=[1] * 8, loss_mask=loss_mask)  # type: ignore[arg-type]
    assert forwards == [] and store.health().sample_count == 0, "nothing ran, nothing was stored"
    producer.produce(input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask)
    assert forwards == [1]
