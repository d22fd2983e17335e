"""``featurestream.hf``'s DFlash, DSpark and EAGLE-1/2 wrappers against the reference's own: every field equal, bit
for bit.

Tiny random-init Llama, Qwen2 and Qwen3 models (no download) in float32 and bfloat16, right-padded and packed
inputs. The layer ids cover the conventions that differ between the wrappers: DFlash's last layer is that layer's
own output, DSpark's is the final norm's output and its ``-1`` the embedding output, ids in any order for DFlash.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from typing import Any

import pytest
import torch

pytest.importorskip("transformers", reason="the HF backend tests need transformers: pip install 'featurestream[hf]'")

from featurestream.hf import HFDFlashTargetModel, HFDSparkTargetModel, HFEagleTargetModel
from featurestream.tools.models import tiny_hf_causal_lm

from .conftest import PREFIX, Reference, assert_takes_the_references_parameters
from .test_compat_hf import CONFIG, packed, padded

LAYERS = 6
OURS = {"dflash": HFDFlashTargetModel, "dspark": HFDSparkTargetModel, "eagle": HFEagleTargetModel}
THEIRS = {"dflash": "dflash.target", "dspark": "dspark.target", "eagle": "eagle.target_v12"}
# (algorithm, constructor arguments after the model): the last layer (5), the embedding (-1), unordered ids.
CASES = (
    ("dflash", {"target_layer_ids": [1, 5, 3]}),
    ("dflash", {"target_layer_ids": [1, 5, 3], "capture_logits": True}),
    ("dspark", {"target_layer_ids": [-1, 2, 5]}),
    ("dspark", {"target_layer_ids": [0, 3]}),
    ("eagle", {}),
)


def reference_class(reference: Reference, algorithm: str) -> type:
    """The reference's wrapper class (``reference`` only proves the package imports)."""
    module = importlib.import_module(f"{PREFIX}.{THEIRS[algorithm]}")
    return getattr(module, OURS[algorithm].__name__)  # type: ignore[no-any-return]


def assert_identical(ours: Any, theirs: Any) -> None:
    """Same fields in the same order, each ``None`` in both or the same dtype and ``torch.equal``."""
    assert [f.name for f in dataclasses.fields(ours)] == [f.name for f in dataclasses.fields(theirs)]
    for field in dataclasses.fields(theirs):
        mine, expected = getattr(ours, field.name), getattr(theirs, field.name)
        assert (mine is None) == (expected is None), field.name
        if expected is not None:
            assert mine.dtype == expected.dtype and torch.equal(mine, expected), field.name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("inputs", [padded, packed], ids=["padded", "packed"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_generate_batch_equals_the_references(
    reference: Reference, family: str, inputs: Callable[[int], dict[str, torch.Tensor]], dtype: torch.dtype
) -> None:
    model = tiny_hf_causal_lm(family, CONFIG, num_layers=LAYERS).to(dtype)
    given = inputs(0)
    for algorithm, arguments in CASES:
        ours = OURS[algorithm](model, **arguments).generate_batch(**given)
        theirs = reference_class(reference, algorithm)(model, **arguments).generate_batch(**given)
        assert_identical(ours, theirs)
        floats = [t for t in ours.tensors().values() if t.is_floating_point()]
        assert floats and all(t.dtype == dtype for t in floats), f"{algorithm}: states in the model's dtype"


class ProvidedFeatures(torch.nn.Module):
    """A target that picks its own DSpark capture points: the input of the module after each requested layer."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = tiny_hf_causal_lm("qwen3", CONFIG, num_layers=LAYERS)
        self.config = self.inner.config
        self.model = self.inner.model  # where the wrappers find the decoder layers and the final norm

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.inner.get_input_embeddings()

    def get_dspark_target_feature_modules(self, layer_ids: list[int]) -> tuple[torch.nn.Module, ...]:
        following = [*self.model.layers, self.model.norm]
        return tuple(following[layer + 1] for layer in layer_ids)


def test_a_models_own_dspark_feature_modules_equal_the_references(reference: Reference) -> None:
    model = ProvidedFeatures().eval()
    ids = [-1, 2, 5]
    ours = HFDSparkTargetModel(model, ids)
    theirs = reference_class(reference, "dspark")(model, ids)
    for given in (padded(1), packed(1)):
        assert_identical(ours.generate_batch(**given), theirs.generate_batch(**given))
    # The inputs of the layers after -1 and 2 are the default capture points' states; the final norm's input
    # (after layer 5) is the last layer's own output, not the norm's output the default takes for that id.
    provided = ours.generate_batch(**padded(1)).target_hidden_states.split(CONFIG.hidden_size, dim=-1)
    plain = HFDSparkTargetModel(model.inner, ids).generate_batch(**padded(1)).target_hidden_states
    assert torch.equal(torch.cat(provided[:2], dim=-1), plain[..., : 2 * CONFIG.hidden_size])
    assert not torch.equal(provided[2], plain[..., 2 * CONFIG.hidden_size :])


@pytest.mark.parametrize("algorithm", sorted(OURS))
def test_the_constructors_and_generate_batch_take_the_references_arguments(
    reference: Reference, algorithm: str
) -> None:
    ours, theirs = OURS[algorithm], reference_class(reference, algorithm)
    assert_takes_the_references_parameters(ours, theirs)
    assert list(inspect.signature(ours.generate_batch).parameters) == list(
        inspect.signature(theirs.generate_batch).parameters
    )


class _Mixer(torch.nn.Module):
    """Where a hyper-connection model joins its ``[B, T, streams, H]`` residual streams (their mean here)."""

    def forward(self, streams: torch.Tensor) -> torch.Tensor:
        return streams.mean(dim=2)


class _StreamsInner(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        hidden = CONFIG.hidden_size
        self.embed_tokens = torch.nn.Embedding(CONFIG.vocab_size, hidden)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(3))
        self.mixers = torch.nn.ModuleList(_Mixer() for _ in range(3))
        self.norm = torch.nn.LayerNorm(hidden)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        for layer, mixer in zip(self.layers, self.mixers, strict=True):
            out = layer(hidden)
            hidden = mixer(torch.stack([out, 2 * out], dim=2))
        return self.norm(hidden)


class StreamsModel(torch.nn.Module):
    """A target whose DSpark features are the inputs of its stream mixers: ``[B, T, 2, H]`` states."""

    def __init__(self) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.model = _StreamsInner()
            self.lm_head = torch.nn.Linear(CONFIG.hidden_size, CONFIG.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> Any:
        return self.lm_head(self.model(input_ids))

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.embed_tokens

    def get_dspark_target_feature_modules(self, layer_ids: list[int]) -> tuple[torch.nn.Module, ...]:
        return tuple(self.model.mixers[layer] for layer in layer_ids)


def test_feature_modules_taking_residual_streams_give_their_mean_as_the_references(reference: Reference) -> None:
    model = StreamsModel().eval()
    given = padded(2)
    ours = HFDSparkTargetModel(model, [0, 2]).generate_batch(**given)
    assert_identical(ours, reference_class(reference, "dspark")(model, [0, 2]).generate_batch(**given))
    with torch.no_grad():
        first = model.model.layers[0](model.model.embed_tokens(given["input_ids"]))
    assert torch.allclose(ours.target_hidden_states[..., : CONFIG.hidden_size], 1.5 * first), "the streams' mean"
