"""The README's "Any Hugging Face model as the target" block, run as written with a tiny model in place of the 8B
one: dict prompts (the block's own format) through producer -> store -> queue -> loader, and the same prompts
through a ``ResumableProducer`` (which refused dict prompts in its thread, and the trainer waited for ever)."""

from __future__ import annotations

import pathlib
import re
import threading

import pytest
import torch

from featurestream import FeatureDataLoader, FeatureProducer, LocalFeatureStore, SampleRefQueue
from featurestream.eagle3 import Eagle3TargetBatch
from featurestream.hf import HFEagle3TargetModel
from featurestream.pipeline.resume import ResumableProducer
from support.tiny import prompts as tiny_prompts
from support.tiny import tiny_model

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
pytestmark = pytest.mark.timeout(120)


def _hf_block() -> str:
    text = README.read_text()
    section = text[text.index("## Any Hugging Face model as the target\n") :]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]


def _dict_prompts(count: int) -> list[dict[str, torch.Tensor]]:
    names = ("input_ids", "attention_mask", "loss_mask")
    return [dict(zip(names, tiny_prompts(batch=1, length=8, seed=seed), strict=True)) for seed in range(count)]


class Draft:
    """Stands in for the README's ``draft``: records the batches it is asked to score."""

    def __init__(self) -> None:
        self.batches: list[Eagle3TargetBatch] = []

    def loss(self, batch: Eagle3TargetBatch) -> torch.Tensor:
        self.batches.append(batch)
        return batch.logits.float().mean()


def test_the_readme_hf_block_runs_with_a_tiny_model_and_its_dict_prompts() -> None:
    block = _hf_block()
    loading = re.compile(r"^model = AutoModelForCausalLM\.from_pretrained\(.*\)$", flags=re.M)
    assert len(loading.findall(block)) == 1, "the block loads its model on one line"
    draft = Draft()
    namespace = {"__name__": "readme_hf", "prompts": _dict_prompts(3), "draft": draft, "tiny_model": tiny_model}
    exec(compile(loading.sub('model = tiny_model("llama")', block), str(README), "exec"), namespace)
    assert len(draft.batches) == 3 and all(batch.aux_hidden_states.shape[-1] == 3 * 32 for batch in draft.batches)


def test_a_resumable_producer_streams_the_same_dict_prompts() -> None:
    store = LocalFeatureStore(max_bytes=8 << 30)
    queue = SampleRefQueue(store)
    producer = FeatureProducer(HFEagle3TargetModel(tiny_model("llama")), store, run_id="run-1")
    resumable = ResumableProducer(producer, queue, _dict_prompts(3))
    thread = threading.Thread(target=resumable.run, daemon=True)
    thread.start()
    with FeatureDataLoader(queue, store) as loader:
        batches = [batch for batch, _ in zip(loader, range(3), strict=False)]
    thread.join(30)
    assert len(batches) == 3 and resumable.report.produced == 3 and not thread.is_alive()
