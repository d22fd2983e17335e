"""An EAGLE-3 target backend for any Hugging Face causal LM (optional extra ``featurestream[hf]``).

``HFEagle3TargetModel(model)`` wraps an ``AutoModelForCausalLM``-style model
(Llama, Qwen2/3, Mistral, Gemma, ...) so that ``FeatureProducer`` can drive
it: each ``generate_batch`` call runs one no-grad forward in eval mode and
returns an ``Eagle3TargetBatch`` equal, tensor for tensor, to what the
reference's ``HFEagle3TargetModel.generate_batch`` returns for the same model
and inputs:

- ``aux_hidden_states`` ``[B, T, 3H]``: the outputs of the three auxiliary
  decoder layers, captured with forward hooks (never with
  ``output_hidden_states=True``, which would keep every layer's states
  alive), concatenated on the last axis in the order of ``aux_layer_ids``;
  not shifted;
- ``logits`` ``[B, T, V]``, ``input_ids`` and ``loss_mask``: shifted one
  position left, the last position zero (the EAGLE-3 token alignment, see
  ``featurestream.pipeline.eagle3``): position ``t`` carries the LM head's
  logits, the token id and the loss mask of position ``t + 1``;
- ``attention_mask`` and the packing metadata ``position_ids``, ``seq_lens``,
  ``doc_remaining``: passed through as given.

With packing (``seq_lens`` given) each packed document attends only to
itself: the model gets the per-document ``position_ids`` and a ``[B, 1, T,
T]`` block-causal additive mask built from ``seq_lens`` (``attention_mask``
is not fed to the model then), or, for a FlashAttention model, no mask at all
(batch size 1), FlashAttention finding the documents from ``position_ids``.

Recipe::

    from transformers import AutoModelForCausalLM
    from featurestream.pipeline.hf import HFEagle3TargetModel

    target = HFEagle3TargetModel(AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16, device_map="cuda"))
    producer = FeatureProducer(target, store, run_id="run-1")  # algorithm inferred: EAGLE3
"""

from __future__ import annotations

import inspect
import numbers
import threading
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

try:
    import transformers
except ImportError as exc:
    raise ImportError(
        "featurestream.pipeline.hf needs Hugging Face transformers, which is not installed: "
        "pip install 'featurestream[hf]'"
    ) from exc

from featurestream.pipeline.eagle3 import Eagle3ForwardBackend, ForwardInputs, packed_attention_allowed

__all__ = ["HFEagle3TargetModel", "default_aux_layer_ids", "find_decoder_layers"]

# Where Hugging Face causal LMs keep their decoder layer list, most common first.
_LAYER_PATHS = (
    "model.layers",  # Llama, Mistral, Qwen2/3, Gemma 1-3, Phi-3, OLMo, ...
    "model.language_model.layers",  # multimodal wrappers (transformers 5)
    "language_model.model.layers",  # multimodal wrappers (transformers 4)
    "model.decoder.layers",  # OPT
    "transformer.h",  # GPT-2, Falcon, Bloom, GPT-J
    "gpt_neox.layers",  # GPT-NeoX, Pythia
    "transformer.layers",
    "transformer.blocks",  # MPT
)


def default_aux_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """The EAGLE-3 recipe's auxiliary layers ``(1, n//2 - 1, n - 4)`` for ``n`` decoder layers.

    ``ValueError`` (naming ``n``) when the model is too shallow for three
    distinct in-range layers, i.e. ``n < 7``.
    """
    ids = (1, num_layers // 2 - 1, num_layers - 4)
    if len(set(ids)) != 3 or min(ids) < 0 or max(ids) >= num_layers:
        raise ValueError(
            f"the default EAGLE-3 auxiliary layers [1, n//2 - 1, n - 4] = {list(ids)} are not three distinct "
            f"layers of a model with n={num_layers} decoder layers (the recipe needs n >= 7); "
            "pass aux_layer_ids=(low, mid, high) explicitly"
        )
    return ids


def _resolve(root: nn.Module, path: str) -> Any:
    node: Any = root
    for name in path.split("."):
        node = getattr(node, name, None)
        if node is None:
            return None
    return node


def _num_hidden_layers(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    if config is None:
        return None
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    value = getattr(text_config, "num_hidden_layers", None)
    return value if isinstance(value, int) else None


def find_decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layer list of a Hugging Face causal LM.

    Tries the usual attribute paths (``model.layers``, ``transformer.h``, ...),
    then the shallowest ``nn.ModuleList`` as long as the config's
    ``num_hidden_layers``. ``ValueError`` when neither finds one.
    """
    for path in _LAYER_PATHS:
        layers = _resolve(model, path)
        if isinstance(layers, nn.ModuleList) and len(layers) > 0:
            return layers
    expected = _num_hidden_layers(model)
    if expected is not None:
        for module in model.modules():
            if isinstance(module, nn.ModuleList) and len(module) == expected:
                return module
    raise ValueError(
        f"cannot find the decoder layers of {type(model).__name__}: none of {list(_LAYER_PATHS)} is a "
        f"non-empty nn.ModuleList, and no nn.ModuleList has config.num_hidden_layers={expected} entries"
    )


def _check_aux_layer_ids(aux_layer_ids: Sequence[int], num_layers: int) -> tuple[int, int, int]:
    if isinstance(aux_layer_ids, (str, bytes)) or not isinstance(aux_layer_ids, Sequence):
        raise ValueError(f"aux_layer_ids must be a sequence of three layer indices, got {aux_layer_ids!r}")
    if len(aux_layer_ids) != 3:
        raise ValueError(f"aux_layer_ids must name exactly three layers, got {len(aux_layer_ids)}: {aux_layer_ids!r}")
    for value in aux_layer_ids:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f"aux_layer_ids must be ints, got {value!r} ({type(value).__name__}) in {aux_layer_ids!r}")
        if not 0 <= value < num_layers:
            raise ValueError(
                f"aux layer id {value!r} is out of range for a model with {num_layers} decoder layers "
                f"(valid: 0..{num_layers - 1})"
            )
    ids = tuple(int(value) for value in aux_layer_ids)
    if len(set(ids)) != 3:
        duplicate = next(value for value in ids if ids.count(value) > 1)
        raise ValueError(f"aux_layer_ids must be three distinct layers, got {duplicate} twice in {list(ids)}")
    return ids  # type: ignore[return-value]


def _first_tensor(output: Any) -> torch.Tensor:
    """The hidden state in a module's output: a tensor, the first item of a tuple, or ``last_hidden_state``."""
    hidden = getattr(output, "last_hidden_state", None)
    if hidden is None and isinstance(output, (tuple, list)) and output:
        hidden = output[0]
    if hidden is None:
        hidden = output
    if not isinstance(hidden, torch.Tensor):
        raise TypeError(f"expected a hidden-state tensor from the hooked module, got {type(hidden).__name__}")
    return hidden


class HFEagle3TargetModel(Eagle3ForwardBackend):
    """EAGLE-3 target backend over a Hugging Face causal LM (see the module docstring for the batch it returns).

    ``aux_layer_ids``: three distinct decoder-layer indices (low, mid, high),
    default the EAGLE-3 recipe ``[1, n//2 - 1, n - 4]``; ``ValueError`` for
    anything else. Each captured state is the layer's own output, also for
    the last layer (``n - 1``), where Hugging Face's ``hidden_states[n]`` is
    the final norm's output instead.

    ``cp_mesh``: the reference's context-parallel mesh argument; ``None`` or a
    mesh of size 1 (no sharding) is accepted, a larger one is ``ValueError``.

    Each forward runs under ``torch.no_grad()`` in eval mode (every
    submodule's train/eval flag is restored afterwards, also on error); its
    hooks are removed when it returns or raises. Forwards are serialised
    (hooks are per model), so one wrapper may be shared by threads.

    An ``Eagle3TargetBackend``: ``FeatureProducer(HFEagle3TargetModel(...),
    store, run_id=...)`` infers ``FeatureAlgorithm.EAGLE3``.
    """

    def __init__(self, model: nn.Module, aux_layer_ids: Sequence[int] | None = None, cp_mesh: Any = None) -> None:
        if cp_mesh is not None and cp_mesh.size() > 1:
            raise ValueError(
                f"featurestream's HFEagle3TargetModel runs the target forward unsharded; a context-parallel mesh of "
                f"size {cp_mesh.size()} needs the reference's HFEagle3TargetModel (FeatureProducer accepts it as is)"
            )
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module (a Hugging Face causal LM), got {type(model).__name__}")
        if not callable(getattr(model, "get_output_embeddings", None)) or model.get_output_embeddings() is None:
            raise ValueError(
                f"{type(model).__name__} has no LM head (get_output_embeddings() is missing or None); "
                "load it with AutoModelForCausalLM, not AutoModel"
            )
        self.model = model
        self._layers = find_decoder_layers(model)
        self.num_layers = len(self._layers)
        self.aux_layer_ids: tuple[int, int, int] = (
            default_aux_layer_ids(self.num_layers)
            if aux_layer_ids is None
            else _check_aux_layer_ids(aux_layer_ids, self.num_layers)
        )
        self.selected_token_ids: torch.Tensor | None = None
        self.selected_token_mask: torch.Tensor | None = None
        self._lock = threading.Lock()

    @property
    def config(self) -> transformers.PreTrainedConfig | None:
        """The wrapped model's config (``None`` for a model without one)."""
        return getattr(self.model, "config", None)

    @property
    def hidden_size(self) -> int:
        """Width ``H`` of one decoder layer's output (``aux_hidden_states`` is ``3H`` wide)."""
        return int(self.get_input_embeddings().weight.shape[1])

    @property
    def vocab_size(self) -> int:
        """Rows of the LM head: the last dimension of ``logits``."""
        return int(self.model.get_output_embeddings().weight.shape[0])

    def get_input_embeddings(self) -> nn.Module:
        """The target's token embedding module (a draft head may copy or share it)."""
        return self.model.get_input_embeddings()

    def set_vocab_mapping(
        self, selected_token_ids: torch.Tensor | None, selected_token_mask: torch.Tensor | None
    ) -> None:
        """Record the draft vocabulary: the target token ids it keeps and the mask of them over the target vocab.

        The mapping is stored (``selected_token_ids``, ``selected_token_mask``)
        for the trainer side; ``generate_batch`` keeps emitting the full
        target-vocabulary ``logits`` (the producer requires them), from which
        a draft-vocab trainer selects ``logits[..., selected_token_ids]``.
        ``None, None`` clears the mapping.
        """
        if selected_token_ids is None and selected_token_mask is None:
            self.selected_token_ids = self.selected_token_mask = None
            return
        for name, value in (("selected_token_ids", selected_token_ids), ("selected_token_mask", selected_token_mask)):
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        assert selected_token_ids is not None and selected_token_mask is not None
        if selected_token_ids.is_floating_point() or selected_token_ids.dtype == torch.bool:
            raise ValueError(f"selected_token_ids must be an integer tensor, got {selected_token_ids.dtype}")
        if selected_token_ids.numel() and not (
            0 <= int(selected_token_ids.min()) and int(selected_token_ids.max()) < self.vocab_size
        ):
            raise ValueError(f"selected_token_ids must lie in [0, {self.vocab_size}) (the target vocabulary)")
        self.selected_token_ids = selected_token_ids
        self.selected_token_mask = selected_token_mask

    def forward_features(self, inputs: ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """``(aux_hidden_states, logits)`` of one eval forward over ``inputs.input_ids [B, T]``: fresh tensors on
        the model's device, not shifted.

        Without ``seq_lens`` the model gets ``input_ids`` and
        ``attention_mask``; with it (packing), the per-document
        ``position_ids`` and the block-causal mask of ``seq_lens`` (see the
        module docstring). ``ValueError`` for packing without
        ``position_ids``, a model whose forward takes none, or a FlashAttention
        model given a batch of more than one row.
        """
        with self._lock:
            return self._forward(inputs)

    def _model_inputs(self, given: ForwardInputs) -> dict[str, Any]:
        device = self.get_input_embeddings().weight.device
        input_ids, position_ids, seq_lens = given.input_ids, given.position_ids, given.seq_lens
        inputs: dict[str, Any] = {"input_ids": input_ids.to(device)}
        if seq_lens is None:
            inputs["attention_mask"] = given.attention_mask.to(device)
            return inputs
        if position_ids is None or "position_ids" not in inspect.signature(self.model.forward).parameters:
            raise ValueError(
                f"packed inputs (seq_lens given) need per-document position_ids and a model whose forward takes them; "
                f"got position_ids={'None' if position_ids is None else 'a tensor'} for {type(self.model).__name__}"
            )
        inputs["position_ids"] = position_ids.to(device)
        implementation = getattr(self.config, "_attn_implementation", None) or ""
        if "flash" in implementation:
            if input_ids.shape[0] != 1:
                raise ValueError(
                    f"packed inputs on a FlashAttention model ({implementation}) take one row per batch (it finds the "
                    f"documents from position_ids), got {input_ids.shape[0]} rows; load the model with "
                    "attn_implementation='sdpa' to pack more"
                )
            inputs["attention_mask"] = None
            return inputs
        allowed = packed_attention_allowed(seq_lens.to(device), input_ids.shape[1])
        dtype = next(self.model.parameters()).dtype
        blocked = torch.full(allowed.shape, torch.finfo(dtype).min, dtype=dtype, device=device)
        inputs["attention_mask"] = blocked.masked_fill_(allowed, 0.0).unsqueeze(1)
        return inputs

    def _forward(self, given: ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = self._model_inputs(given)
        # One [B, T, 3H] buffer, filled slot by slot as the hooked layers run: a single copy of each state,
        # taken at once (so a later layer cannot modify it in place under us), and no concatenation afterwards.
        buffer: list[torch.Tensor] = []
        filled = [False, False, False]

        def capture(slot: int) -> Any:
            def hook(module: nn.Module, args: Any, output: Any) -> None:
                hidden = _first_tensor(output)
                width = hidden.shape[-1]
                if not buffer:
                    buffer.append(hidden.new_empty((*hidden.shape[:-1], 3 * width)))
                buffer[0][..., slot * width : (slot + 1) * width].copy_(hidden)
                filled[slot] = True

            return hook

        handles = []
        modes = [(module, module.training) for module in self.model.modules()]
        try:
            for slot, layer_id in enumerate(self.aux_layer_ids):
                handles.append(self._layers[layer_id].register_forward_hook(capture(slot)))
            self.model.eval()
            with torch.no_grad():
                outputs = self.model(**inputs, use_cache=False, output_hidden_states=False, return_dict=True)
        finally:
            for handle in handles:
                handle.remove()
            for module, training in modes:
                module.training = training
        missing = [layer for layer, done in zip(self.aux_layer_ids, filled, strict=True) if not done]
        if missing:
            raise RuntimeError(f"the forward of {type(self.model).__name__} never ran decoder layer(s) {missing}")
        logits = outputs.logits if hasattr(outputs, "logits") else outputs[0]
        return buffer[0], logits
