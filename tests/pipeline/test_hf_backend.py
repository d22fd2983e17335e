"""``HFEagle3TargetModel`` on real (tiny, random-init) transformers architectures, through the whole pipeline."""

from __future__ import annotations

import importlib.util
import sys
import threading
from typing import Any

import pytest
import torch

pytest.importorskip("transformers", reason="the HF backend tests need transformers: pip install 'featurestream[hf]'")

from featurestream.eagle3 import Eagle3TargetBackend, Eagle3TargetBatch, ForwardInputs
from featurestream.loader import FeatureDataLoader
from featurestream.pipeline import hf
from featurestream.pipeline.hf import HFEagle3TargetModel, default_aux_layer_ids
from featurestream.producer import FeatureProducer
from featurestream.queue import SampleRefQueue
from featurestream.refs import FeatureAlgorithm
from featurestream.stores.local import LocalFeatureStore
from support.tiny import FAMILIES, HIDDEN, VOCAB, hook_count, prompts, reference_forward, shifted, tiny_model


def stream(target: HFEagle3TargetModel, *inputs: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """Producer -> LocalFeatureStore -> SampleRefQueue -> FeatureDataLoader; each batch's tensors, cloned."""
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    producer = FeatureProducer(target, store, run_id="hf")
    for given in inputs:
        queue.put(producer.produce(**given))
    queue.close()
    got = []
    with FeatureDataLoader(queue, store) as loader:
        for batch in loader:
            assert isinstance(batch, Eagle3TargetBatch)
            got.append({name: batch[name].clone() for name in batch.keys()})
    assert queue.stats().acked == len(inputs) and store.health().sample_count == 0
    return got


def as_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor) -> dict[str, Any]:
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_streamed_features_equal_the_models_own_hidden_states_and_logits(family: str) -> None:
    model = tiny_model(family)
    target = HFEagle3TargetModel(model)
    assert target.aux_layer_ids == (1, 3, 4), "the EAGLE-3 recipe's layers of an 8-layer model"
    given = [as_inputs(*prompts(seed=0)), as_inputs(*prompts(batch=3, length=9, seed=1))]
    for sent, got in zip(given, stream(target, *given), strict=True):
        assert list(got) == ["aux_hidden_states", "input_ids", "attention_mask", "loss_mask", "logits"]
        aux, logits = reference_forward(
            model, target.aux_layer_ids, input_ids=sent["input_ids"], attention_mask=sent["attention_mask"]
        )
        batch, length = sent["input_ids"].shape
        assert got["aux_hidden_states"].shape == (batch, length, 3 * HIDDEN)
        assert got["logits"].shape == (batch, length, VOCAB)
        assert torch.equal(got["aux_hidden_states"], aux), "bit-for-bit the hidden_states[i + 1] of the aux layers"
        assert torch.equal(got["logits"], logits)
        assert torch.equal(got["attention_mask"], sent["attention_mask"]), "attention_mask is not shifted"
        for name in ("input_ids", "loss_mask"):
            assert torch.equal(got[name], shifted(sent[name])), f"{name} in the EAGLE-3 alignment"


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_explicit_layers_in_their_order_including_the_last(family: str) -> None:
    model = tiny_model(family)
    target = HFEagle3TargetModel(model, aux_layer_ids=[7, 0, 5])
    assert target.aux_layer_ids == (7, 0, 5)
    input_ids, attention_mask, loss_mask = prompts()
    got = target.generate_batch(input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask)
    aux, logits = reference_forward(model, (7, 0, 5), input_ids=input_ids, attention_mask=attention_mask)
    # Layer n - 1's entry is its own output (as the reference's wrapper takes it), not hidden_states[n] (post-norm).
    assert torch.equal(got.aux_hidden_states, aux) and torch.equal(got.logits, logits)


def test_default_layer_ids_follow_the_eagle3_recipe() -> None:
    assert default_aux_layer_ids(7) == (1, 2, 3)
    assert default_aux_layer_ids(8) == (1, 3, 4)
    assert default_aux_layer_ids(32) == (1, 15, 28)
    assert default_aux_layer_ids(80) == (1, 39, 76)
    assert HFEagle3TargetModel(tiny_model(layers=7)).aux_layer_ids == (1, 2, 3)
    assert HFEagle3TargetModel(tiny_model("mistral", layers=12)).aux_layer_ids == (1, 5, 8)


@pytest.mark.parametrize("layers", [1, 3, 4, 6])
def test_a_model_too_shallow_for_the_recipe_is_refused(layers: int) -> None:
    with pytest.raises(ValueError, match=rf"n={layers} decoder layers.*n >= 7.*aux_layer_ids"):
        HFEagle3TargetModel(tiny_model(layers=layers))
    assert HFEagle3TargetModel(tiny_model(layers=4), aux_layer_ids=(0, 1, 3)).aux_layer_ids == (0, 1, 3)


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ((1, 2), r"exactly three layers, got 2"),
        ((1, 2, 3, 4), r"exactly three layers, got 4"),
        ((1, 3, 3), r"distinct layers, got 3 twice"),
        ((1, 3, 8), r"aux layer id 8 is out of range .* 8 decoder layers"),
        ((-1, 3, 4), r"aux layer id -1 is out of range"),
        ((True, 3, 4), r"must be ints, got True \(bool\)"),
        ((1.0, 3, 4), r"must be ints, got 1.0 \(float\)"),
        (("1", 3, 4), r"must be ints, got '1' \(str\)"),
        ("134", r"sequence of three layer indices, got '134'"),
        (3, r"sequence of three layer indices, got 3"),
    ],
)
def test_explicit_layer_ids_are_validated(ids: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HFEagle3TargetModel(tiny_model(), aux_layer_ids=ids)


def test_numpy_style_integers_are_accepted() -> None:
    ids = (torch.tensor(1).item(), 2, 3)  # plain ints after .item(); numbers.Integral covers numpy ints too
    assert HFEagle3TargetModel(tiny_model(), aux_layer_ids=ids).aux_layer_ids == (1, 2, 3)


def test_not_a_causal_lm_is_refused() -> None:
    import transformers

    with pytest.raises(TypeError, match=r"torch.nn.Module"):
        HFEagle3TargetModel(object())  # type: ignore[arg-type]
    base = transformers.LlamaModel(tiny_model().config)
    with pytest.raises(ValueError, match=r"no LM head.*AutoModelForCausalLM"):
        HFEagle3TargetModel(base)


def test_hooks_are_removed_after_each_forward_and_after_one_that_raises() -> None:
    model = tiny_model()
    inputs = as_inputs(*prompts())
    reference_forward(model, (1,), **_model_inputs(inputs))  # transformers keeps its own capture hooks installed
    target = HFEagle3TargetModel(model)
    baseline = hook_count(model)
    target.generate_batch(**inputs)
    target.generate_batch(**inputs)
    assert hook_count(model) == baseline

    seen: list[int] = []

    def explode(module: torch.nn.Module, args: Any, output: Any) -> None:
        seen.append(hook_count(model))
        raise RuntimeError("boom in layer 6")

    handle = model.model.layers[6].register_forward_hook(explode)
    try:
        with pytest.raises(RuntimeError, match=r"boom in layer 6"):
            target.generate_batch(**inputs)
    finally:
        handle.remove()
    assert seen == [baseline + 1 + 3], "the wrapper's three hooks were installed during the forward"
    assert hook_count(model) == baseline, "and removed although it raised"
    _, logits = reference_forward(model, (1,), **_model_inputs(inputs))
    assert torch.equal(target.generate_batch(**inputs).logits, logits), "the wrapper still works afterwards"


def _model_inputs(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: inputs[name] for name in ("input_ids", "attention_mask")}


def test_runs_in_eval_and_restores_every_modules_mode_also_on_error() -> None:
    model = tiny_model()
    model.train()
    model.model.layers[2].eval()  # a mixed state must come back exactly, not as model.train(True)
    before = {name: module.training for name, module in model.named_modules()}
    modes: list[bool] = []
    handle = model.model.layers[0].register_forward_hook(lambda module, args, output: modes.append(module.training))
    target = HFEagle3TargetModel(model)
    inputs = as_inputs(*prompts())
    got = target.generate_batch(**inputs)
    assert modes == [False], "the forward ran in eval mode"
    assert {name: module.training for name, module in model.named_modules()} == before
    model.eval()
    aux, logits = reference_forward(model, target.aux_layer_ids, **_model_inputs(inputs))
    assert torch.equal(got.aux_hidden_states, aux) and torch.equal(got.logits, logits), "no dropout in the features"
    model.train()
    handle.remove()
    handle = model.model.layers[0].register_forward_hook(lambda *args: (_ for _ in ()).throw(KeyError("late")))
    with pytest.raises(KeyError, match=r"late"):
        target.generate_batch(**inputs)
    handle.remove()
    assert all(module.training for module in model.modules()), "restored after a forward that raised"


def test_no_gradient_is_recorded() -> None:
    model = tiny_model()
    for parameter in model.parameters():
        parameter.requires_grad_(True)
    target = HFEagle3TargetModel(model)
    with torch.enable_grad():
        got = target.generate_batch(**as_inputs(*prompts()))
    for name in ("aux_hidden_states", "logits"):
        tensor = got[name]
        assert not tensor.requires_grad and tensor.grad_fn is None, name
    assert all(parameter.grad is None for parameter in model.parameters())


def test_packed_documents_attend_only_to_themselves_and_the_metadata_passes_through() -> None:
    model = tiny_model("qwen2")
    target = HFEagle3TargetModel(model)
    input_ids, _, loss_mask = prompts(batch=2, length=10)
    attention_mask = torch.ones_like(input_ids)
    packing = {
        "position_ids": torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 4, 5, 0, 1, 2, 3]]),
        "seq_lens": torch.tensor([[4, 3, 3], [6, 4, 0]]),
        "doc_remaining": torch.tensor([[3, 2, 1, 0, 2, 1, 0, 2, 1, 0], [5, 4, 3, 2, 1, 0, 3, 2, 1, 0]]),
    }
    sent = {**as_inputs(input_ids, attention_mask, loss_mask), **packing}
    (got,) = stream(target, sent)
    for name, tensor in packing.items():
        assert torch.equal(got[name], tensor), name
    # Each document's features are those of a forward over that document alone (close: another kernel shape);
    # its last position holds the next document's first logits, which the shifted per-document ones leave zero.
    for row, lengths in enumerate(packing["seq_lens"].tolist()):
        start = 0
        for length in (n for n in lengths if n):
            document = input_ids[row : row + 1, start : start + length]
            aux, logits = reference_forward(
                model, target.aux_layer_ids, input_ids=document, attention_mask=torch.ones_like(document)
            )
            torch.testing.assert_close(got["aux_hidden_states"][row, start : start + length], aux[0])
            torch.testing.assert_close(got["logits"][row, start : start + length - 1], logits[0, : length - 1])
            start += length
    assert torch.equal(got["input_ids"], shifted(input_ids)) and torch.equal(got["loss_mask"], shifted(loss_mask))


def test_embeddings_and_vocab_mapping() -> None:
    model = tiny_model()
    target = HFEagle3TargetModel(model)
    assert target.get_input_embeddings() is model.model.embed_tokens
    assert (target.hidden_size, target.vocab_size) == (HIDDEN, VOCAB)
    ids = torch.arange(0, VOCAB, 4)
    mask = torch.zeros(VOCAB, dtype=torch.bool)
    mask[ids] = True
    target.set_vocab_mapping(ids, mask)
    assert target.selected_token_ids is ids and target.selected_token_mask is mask
    got = target.generate_batch(**as_inputs(*prompts()))
    assert got.logits.shape[-1] == VOCAB, "full target-vocabulary logits; the trainer selects the draft vocab"
    with pytest.raises(ValueError, match=r"\[0, 128\)"):
        target.set_vocab_mapping(torch.tensor([0, VOCAB]), mask)
    with pytest.raises(ValueError, match=r"integer tensor"):
        target.set_vocab_mapping(ids.float(), mask)
    with pytest.raises(TypeError, match=r"selected_token_mask must be a torch.Tensor"):
        target.set_vocab_mapping(ids, [True])  # type: ignore[arg-type]
    target.set_vocab_mapping(None, None)
    assert target.selected_token_ids is None and target.selected_token_mask is None


def test_a_missing_transformers_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` raise ImportError
    spec = importlib.util.spec_from_file_location("featurestream_hf_without_transformers", hf.__file__)
    assert spec is not None and spec.loader is not None
    with pytest.raises(ImportError, match=r"pip install 'featurestream\[hf\]'"):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_the_producer_infers_eagle3_from_the_backend_class() -> None:
    target = HFEagle3TargetModel(tiny_model())
    assert isinstance(target, Eagle3TargetBackend)
    store = LocalFeatureStore()
    producer = FeatureProducer(target, store, run_id="r")
    assert producer.algorithm is FeatureAlgorithm.EAGLE3
    ref = producer.produce(**as_inputs(*prompts()))
    assert ref.algorithm is FeatureAlgorithm.EAGLE3 and ref.schema_version == 1


def test_the_producer_forwards_embeddings_and_vocab_mapping_to_the_backend() -> None:
    model = tiny_model()
    target = HFEagle3TargetModel(model)
    producer = FeatureProducer(target, LocalFeatureStore(), run_id="r")
    assert producer.get_input_embeddings() is model.get_input_embeddings()
    ids, mask = torch.tensor([0, 5, 9]), torch.zeros(VOCAB, dtype=torch.bool)
    mask[ids] = True
    producer.set_vocab_mapping(ids, mask)
    assert target.selected_token_ids is ids and target.selected_token_mask is mask
    input_ids, attention_mask, loss_mask = prompts()
    ref = producer.produce(input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask)
    assert ref.feature_specs["logits"].shape[-1] == VOCAB and ref.num_tokens == int(loss_mask.sum())


def test_gpt2_layout_is_found_and_its_last_layer_is_that_layers_own_output() -> None:
    import transformers

    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=HIDDEN, n_layer=8, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(config).eval()
    target = HFEagle3TargetModel(model, aux_layer_ids=(1, 4, 7))
    inputs = as_inputs(*prompts())
    aux, logits = reference_forward(model, (1, 4, 7), **_model_inputs(inputs))
    got = target.generate_batch(**inputs)
    assert torch.equal(got.aux_hidden_states, aux) and torch.equal(got.logits, logits)


def test_bfloat16_features_keep_the_models_dtype_bit_for_bit() -> None:
    model = tiny_model("qwen3").to(torch.bfloat16)
    target = HFEagle3TargetModel(model)
    inputs = as_inputs(*prompts())
    got = target.generate_batch(**inputs)
    aux, logits = reference_forward(model, target.aux_layer_ids, **_model_inputs(inputs))
    assert got.aux_hidden_states.dtype == got.logits.dtype == torch.bfloat16
    assert torch.equal(got.aux_hidden_states, aux) and torch.equal(got.logits, logits)


class Wrapped(torch.nn.Module):
    """A causal LM behind an unusual attribute path (as adapters and wrappers put it)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.inner.get_input_embeddings()

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.inner.get_output_embeddings()

    def forward(self, **kwargs: Any) -> Any:
        return self.inner(**kwargs)


def test_decoder_layers_at_an_unusual_path_are_found_by_the_configs_layer_count() -> None:
    inner = tiny_model("mistral")
    target = HFEagle3TargetModel(Wrapped(inner), aux_layer_ids=(2, 5, 7))
    assert target._layers is inner.model.layers
    inputs = as_inputs(*prompts())
    aux, logits = reference_forward(inner, (2, 5, 7), **_model_inputs(inputs))
    got = target.generate_batch(**inputs)
    assert torch.equal(got.aux_hidden_states, aux) and torch.equal(got.logits, logits)


def test_a_model_without_decoder_layers_is_refused() -> None:
    class Headed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = torch.nn.Linear(4, 4)

        def get_output_embeddings(self) -> torch.nn.Module:
            return self.head

    with pytest.raises(ValueError, match=r"cannot find the decoder layers of Headed"):
        HFEagle3TargetModel(Headed())


def test_forwards_from_several_threads_each_get_their_own_features() -> None:
    model = tiny_model()
    target = HFEagle3TargetModel(model)
    given = [as_inputs(*prompts(batch=1 + seed % 3, length=6 + seed, seed=seed)) for seed in range(8)]
    expected = [reference_forward(model, target.aux_layer_ids, **_model_inputs(inputs)) for inputs in given]
    results: dict[int, Eagle3TargetBatch] = {}

    def work(index: int) -> None:
        results[index] = target.generate_batch(**given[index])

    threads = [threading.Thread(target=work, args=(index,)) for index in range(len(given))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for index, (aux, logits) in enumerate(expected):
        assert torch.equal(results[index].aux_hidden_states, aux) and torch.equal(results[index].logits, logits)


def test_packing_needs_position_ids_and_one_row_on_a_flash_attention_model() -> None:
    model = tiny_model("llama")
    target = HFEagle3TargetModel(model)
    input_ids, attention_mask, loss_mask = prompts(batch=2, length=6)
    packing = {
        "position_ids": torch.arange(6).repeat(2, 1),
        "seq_lens": torch.tensor([[6], [6]]),
        "doc_remaining": torch.arange(5, -1, -1).repeat(2, 1),
    }
    inputs = {**as_inputs(input_ids, attention_mask, loss_mask), **packing}
    with pytest.raises(ValueError, match=r"need per-document position_ids .*got position_ids=None"):
        target.forward_features(ForwardInputs(input_ids, attention_mask, None, packing["seq_lens"]))
    with pytest.raises(ValueError, match=r"each row of seq_lens must sum to the sequence length 6, got \[6, 5\]"):
        target.generate_batch(**{**inputs, "seq_lens": torch.tensor([[6], [5]])})
    model.config._attn_implementation = "flash_attention_2"  # refused before any forward: no GPU needed
    with pytest.raises(ValueError, match=r"FlashAttention model \(flash_attention_2\) take one row per batch.*got 2"):
        target.generate_batch(**inputs)
