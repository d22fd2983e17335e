"""Features from a live vLLM engine (``featurestream.vllm``) against the Hugging Face wrappers, and a trainer on them.

One engine process per algorithm (module-scoped): it captures the prompts, records what its bad inputs raise and,
for DFlash, streams every prompt as one sample into a shared-directory store and a Redis queue from inside the
engine step. Here: the captured states equal the HF wrapper's for the same checkpoint within ``TOLERANCE`` (bf16:
vLLM's fused kernels round differently), the reference's DFlash trainer learns from the streamed samples, and every
error names its value.
"""

from __future__ import annotations

import copy
import importlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from compat.reference_trainers import dflash_trainer_module
from featurestream.backends.redis.queue import RedisSampleRefQueue
from featurestream.hf import HFDFlashTargetModel, HFEagle3TargetModel
from featurestream.pipeline.features import ForwardInputs
from featurestream.pipeline.loader import FeatureDataLoader
from featurestream.stores.shared_dir import SharedDirFeatureStore

from .conftest import LAYERS, VOCAB, prompts, run_engine

# Max abs difference between vLLM's and Hugging Face's bf16 states (|states| <= ~1 here); measured up to 0.012.
TOLERANCE = 0.03
PROMPTS = prompts(12)
DFLASH_LAYERS = [3, 0, 5]  # the reference's target_layer_ids: outputs of layers 3, 0 and 5 (the last), in this order
EAGLE3_LAYERS = (1, 2, 4)


@pytest.fixture(scope="module")
def engine_run(checkpoint: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("vllm-features")
    torch.save(PROMPTS, directory / "prompts.pt")
    (directory / "store").mkdir()
    runs: dict[str, Any] = {"url": redis_url, "store": directory / "store", "name": "vllm-features"}
    unloadable = directory / "unloadable"  # the checkpoint under an architecture name no library implements
    shutil.copytree(checkpoint, unloadable)
    config = json.loads((unloadable / "config.json").read_text())
    (unloadable / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchModelForCausalLM"]}))
    for algorithm in ("dflash", "eagle3"):
        out = directory / f"{algorithm}.pt"
        stream = ["--url", redis_url, "--name", runs["name"], "--store-dir", str(runs["store"])]
        runs[algorithm] = run_engine(
            "features",
            "--model", str(checkpoint),
            "--prompts", str(directory / "prompts.pt"),
            "--algorithm", algorithm,
            "--out", str(out),
            *([*stream, "--unloadable", str(unloadable)] if algorithm == "dflash" else []),
        )  # fmt: skip
        runs[algorithm]["captured"] = torch.load(out)
    return runs


@pytest.fixture(scope="module")
def hf_model(checkpoint: Path) -> torch.nn.Module:
    transformers = importlib.import_module("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).eval()


def _max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def test_dflash_states_equal_the_hf_wrappers(engine_run: dict[str, Any], hf_model: torch.nn.Module) -> None:
    wrapper = HFDFlashTargetModel(hf_model, DFLASH_LAYERS)
    captured = engine_run["dflash"]["captured"]
    assert len(captured) == len(PROMPTS)
    for (ids, mask), states in zip(PROMPTS, captured, strict=True):
        batch = wrapper.generate_batch(
            input_ids=ids[None], attention_mask=torch.ones_like(ids)[None], loss_mask=mask[None]
        )
        assert states.dtype == batch.hidden_states.dtype == torch.bfloat16
        assert states.shape == batch.hidden_states.shape[1:] == (len(ids), len(DFLASH_LAYERS) * 256)
        assert _max_error(states, batch.hidden_states[0]) <= TOLERANCE
    # The off-by-one the layer-id mapping exists for: vLLM's id i (layer i's input) is not the reference's.
    with torch.no_grad():
        ids = PROMPTS[0][0][None]
        hidden = hf_model(input_ids=ids, output_hidden_states=True).hidden_states
    inputs = torch.cat([hidden[i][0] for i in DFLASH_LAYERS], dim=-1)
    assert _max_error(captured[0], inputs) > 10 * TOLERANCE


def test_eagle3_aux_states_equal_the_hf_wrappers(engine_run: dict[str, Any], hf_model: torch.nn.Module) -> None:
    wrapper = HFEagle3TargetModel(hf_model, aux_layer_ids=EAGLE3_LAYERS)
    captured = engine_run["eagle3"]["captured"]
    for (ids, _), states in zip(PROMPTS, captured, strict=True):
        aux, _logits = wrapper.forward_features(ForwardInputs(ids[None], torch.ones_like(ids)[None]))
        assert states.shape == aux.shape[1:]
        assert _max_error(states, aux[0]) <= TOLERANCE


def test_bad_input_is_refused_naming_the_value(engine_run: dict[str, Any]) -> None:
    errors = engine_run["dflash"]["errors"]
    assert errors["out_of_range"].startswith("ValueError: target layer id 6 is out of range for a model with 6")
    assert errors["algorithm"].startswith("ValueError: algorithm 'dspark' cannot be captured from vLLM")
    assert errors["no_model"].startswith("ValueError: vLLM cannot load model ") and ".missing" in errors["no_model"]
    assert (
        errors["unloadable"].startswith("RuntimeError: vLLM cannot load model ")
        and "unloadable" in errors["unloadable"]
    )
    eagle3 = engine_run["eagle3"]["errors"]
    for refusal in (eagle3["eagle3_target"], eagle3["eagle3_stream"]):
        assert refusal.startswith("ValueError: ") and "supervision" in refusal and "logits" in refusal


def test_the_references_dflash_trainer_learns_from_the_streamed_samples(
    engine_run: dict[str, Any], hf_model: torch.nn.Module
) -> None:
    """Queue -> store -> loader in this process, from samples the engine process stored and put."""
    streamed = engine_run["dflash"]["streamed"]
    assert len(streamed) == len(PROMPTS) == len(set(streamed))
    # A stream into the closed queue enqueued nothing and left nothing more in the store.
    assert engine_run["dflash"]["after_close"] == 0
    assert engine_run["dflash"]["resident_after_close"] == len(PROMPTS)
    store = SharedDirFeatureStore(engine_run["store"])
    queue = RedisSampleRefQueue(store, url=engine_run["url"], name=engine_run["name"])
    with FeatureDataLoader(queue, store, batch_size=1, algorithm="dflash") as loader:
        batches = [{name: batch[name].clone() for name in batch.keys()} for batch in loader]
    queue.disconnect()
    store.close()
    assert len(batches) == len(PROMPTS) and queue.stats().acked == len(PROMPTS)
    by_tokens = {tuple(ids.tolist()): mask for ids, mask in PROMPTS}
    for batch in batches:
        assert torch.equal(batch["loss_mask"][0], by_tokens[tuple(batch["input_ids"][0].tolist())])
    step = _dflash_trainer(hf_model)
    means = [sum(losses) / len(losses) for losses in ([step(batch) for batch in batches] for _ in range(3))]
    assert all(torch.isfinite(torch.tensor(means))), means
    assert means[0] > means[1] > means[2] and means[2] < 0.95 * means[0], f"mean loss per epoch {means}"


def _dflash_trainer(target: torch.nn.Module) -> Any:
    """The reference's ``DFlashTrainerModule`` over a one-layer Qwen3 draft of ``target``: ``step(batch) -> loss``
    (one AdamW step)."""
    torch.manual_seed(0)
    # Float copies: the target stays bf16 for the other tests.
    head, embeddings = (
        copy.deepcopy(m).float() for m in (target.get_output_embeddings(), target.get_input_embeddings())
    )
    trainer = dflash_trainer_module(
        target, layer_ids=DFLASH_LAYERS, num_target_layers=LAYERS, mask_token_id=VOCAB - 1, block_size=4,
        head=head, embeddings=embeddings,
    )  # fmt: skip
    optimizer = torch.optim.AdamW([p for p in trainer.draft_model.parameters() if p.requires_grad], lr=3e-3)

    def step(batch: dict[str, torch.Tensor]) -> float:
        torch.manual_seed(1)  # the anchors a step samples
        loss = trainer(
            input_ids=batch["input_ids"], hidden_states=batch["hidden_states"].float(), loss_mask=batch["loss_mask"]
        ).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    return step
