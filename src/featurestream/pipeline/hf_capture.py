"""The forward-hook capture every Hugging Face target wrapper in ``featurestream.pipeline.hf`` shares.

A wrapper names its capture points (``Tap``: a module, and whether its
output or its first positional input is taken) and ``HFCaptureModel.capture``
runs the model once under ``torch.no_grad()`` in eval mode with a forward
hook per point, never with ``output_hidden_states=True`` (which would keep
every layer's states alive). Points with a ``slot`` are copied, as their
hook fires, into one ``[..., slots * H]`` buffer (a single copy of each state,
taken before a later module could modify it in place, and no concatenation
afterwards); the others are returned by key as the module produced them.

Packed inputs (``seq_lens`` given) are fed as the reference's wrappers feed
them: the per-document ``position_ids`` and a ``[B, 1, T, T]`` block-causal
additive mask (or, for a FlashAttention model, no mask, batch size 1).
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
import threading
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from featurestream.pipeline.alignment import packed_attention_allowed
from featurestream.pipeline.features import ForwardInputs
from featurestream.pipeline.target_head import TargetHead

__all__ = ["HFCaptureModel", "Tap", "check_layer_ids", "find_base_model", "find_decoder_layers", "find_final_norm"]

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
# The final norm's attribute name on the module that owns the decoder layers.
_NORM_NAMES = ("norm", "final_layernorm", "final_layer_norm", "ln_f", "norm_f")
# Forward flags every wrapper sets when the model takes them: no KV cache, no per-layer states, an output object.
_FORWARD_FLAGS = {"use_cache": False, "output_hidden_states": False, "return_dict": True}


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


def find_base_model(model: nn.Module, layers: nn.ModuleList) -> nn.Module:
    """The module that holds ``layers`` (and the final norm): a causal LM's base model, whose output is the final
    norm's, before any LM head. ``ValueError`` when ``layers`` is not a submodule of ``model``."""
    for owner in model.modules():
        if any(child is layers for child in owner.children()):
            return owner
    raise ValueError(f"the decoder layers are not a submodule of {type(model).__name__}")


def find_final_norm(model: nn.Module, layers: nn.ModuleList) -> nn.Module:
    """The norm whose output feeds the LM head: an attribute named ``norm`` (or ``ln_f``, ...) of the module that
    holds ``layers``. ``ValueError`` naming the names tried when there is none."""
    owner = find_base_model(model, layers)
    for name in _NORM_NAMES:
        norm = getattr(owner, name, None)
        if isinstance(norm, nn.Module):
            return norm
    raise ValueError(
        f"cannot find the final norm of {type(model).__name__}: {type(owner).__name__}, which holds the "
        f"decoder layers, has none of the attributes {list(_NORM_NAMES)}"
    )


def check_layer_ids(
    ids: Sequence[int],
    num_layers: int,
    *,
    name: str,
    count: int | None = None,
    allow_embedding: bool = False,
    increasing: bool = False,
) -> tuple[int, ...]:
    """``ids`` as a tuple of distinct ints in ``[0, num_layers)`` (also ``-1``, the embedding output, when
    ``allow_embedding``); exactly ``count`` of them when given, at least one otherwise; strictly increasing when
    ``increasing``. ``ValueError`` naming ``name`` and the offending value otherwise."""
    what = "a sequence of layer indices" if count is None else f"a sequence of {_words(count)} layer indices"
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise ValueError(f"{name} must be {what}, got {ids!r}")
    if count is not None and len(ids) != count:
        raise ValueError(f"{name} must name exactly {_words(count)} layers, got {len(ids)}: {ids!r}")
    if not ids:
        raise ValueError(f"{name} must name at least one layer, got {ids!r}")
    low = -1 if allow_embedding else 0
    for value in ids:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f"{name} must be ints, got {value!r} ({type(value).__name__}) in {ids!r}")
        if not low <= value < num_layers:
            embedding = " or -1, the embedding output" if allow_embedding else ""
            raise ValueError(
                f"{name.removesuffix('s').replace('_', ' ')} {value!r} is out of range for a model with "
                f"{num_layers} decoder layers (valid: 0..{num_layers - 1}{embedding})"
            )
    checked = tuple(int(value) for value in ids)
    if len(set(checked)) != len(checked):
        duplicate = next(value for value in checked if checked.count(value) > 1)
        raise ValueError(f"{name} must be distinct layers, got {duplicate} twice in {list(checked)}")
    if increasing and list(checked) != sorted(checked):
        raise ValueError(f"{name} must be strictly increasing, got {list(checked)}")
    return checked


def _words(count: int) -> str:
    return {1: "one", 2: "two", 3: "three"}.get(count, str(count))


def _hidden(output: Any) -> torch.Tensor:
    """The hidden state in a module's output: a tensor, the first item of a tuple, or ``last_hidden_state``."""
    hidden = getattr(output, "last_hidden_state", None)
    if hidden is None and isinstance(output, (tuple, list)) and output:
        hidden = output[0]
    if hidden is None:
        hidden = output
    if not isinstance(hidden, torch.Tensor):
        raise TypeError(f"expected a hidden-state tensor from the hooked module, got {type(hidden).__name__}")
    return hidden


def _collapse_streams(hidden: torch.Tensor) -> torch.Tensor:
    """A ``[B, T, streams, H]`` state (hyper-connection residual streams) as their mean ``[B, T, H]``."""
    return hidden.mean(dim=2) if hidden.dim() == 4 else hidden


@dataclasses.dataclass(frozen=True)
class Tap:
    """One capture point of a forward.

    ``module``'s output (or, with ``take_input``, its first positional
    input) is recorded under ``key``, or, with ``slot``, copied into slice
    ``slot`` of the concatenated buffer (``[B, T, streams, H]`` states first
    averaged over the streams). Keys are distinct within one forward.
    """

    module: nn.Module
    key: Hashable
    slot: int | None = None
    take_input: bool = False


@dataclasses.dataclass(frozen=True)
class Captured:
    """What one forward recorded: the concatenated slots (``None`` without slotted taps), the states of the taps
    without a slot, by key, the model's logits (``None`` unless asked for) and, for a forward of the base model, its
    last hidden state (the final norm's output)."""

    concatenated: torch.Tensor | None
    states: Mapping[Hashable, torch.Tensor]
    logits: torch.Tensor | None
    last_hidden: torch.Tensor | None = None


class HFCaptureModel:
    """The shared core of the Hugging Face target wrappers: the model, its decoder layers, and one capture forward.

    ``cp_mesh``: the reference's context-parallel mesh argument; ``None`` or a
    mesh of size 1 (no sharding) is accepted, a larger one is ``ValueError``.
    Forwards are serialised (hooks are per model), so one wrapper may be
    shared by threads; each restores every submodule's train/eval flag and
    removes its hooks when it returns or raises.
    """

    def __init__(self, model: nn.Module, cp_mesh: Any = None) -> None:
        if cp_mesh is not None and cp_mesh.size() > 1:
            raise ValueError(
                f"featurestream's {type(self).__name__} runs the target forward unsharded; a context-parallel mesh "
                f"of size {cp_mesh.size()} needs the reference's {type(self).__name__} (FeatureProducer accepts it)"
            )
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module (a Hugging Face causal LM), got {type(model).__name__}")
        self.model = model
        self.cp_mesh = cp_mesh
        self._layers = find_decoder_layers(model)
        self.num_layers = len(self._layers)
        self._base = find_base_model(model, self._layers)
        self._lock = threading.Lock()

    @property
    def config(self) -> Any:
        """The wrapped model's config (``None`` for a model without one)."""
        return getattr(self.model, "config", None)

    def get_input_embeddings(self) -> nn.Module:
        """The target's token embedding module (a draft head may copy or share it)."""
        return self.model.get_input_embeddings()

    def _require_lm_head(self) -> nn.Module:
        getter = getattr(self.model, "get_output_embeddings", None)
        head = getter() if callable(getter) else None
        if head is None:
            raise ValueError(
                f"{type(self.model).__name__} has no LM head (get_output_embeddings() is missing or None); "
                "load it with AutoModelForCausalLM, not AutoModel"
            )
        return head

    def _supervision_head(self, supervision: str) -> TargetHead | None:
        """The head a trainer rebuilds the logits with under ``supervision="hidden"``; ``None`` for ``"logits"``.
        ``ValueError`` for another value, or a model whose logits a bare head cannot rebuild."""
        if supervision == "logits":
            return None
        if supervision != "hidden":
            raise ValueError(
                f"supervision must be 'logits' (the target's logits are stored) or 'hidden' (its last hidden state, "
                f"the trainer rebuilds the logits with featurestream.TargetHead), got {supervision!r}"
            )
        return TargetHead.from_model(self.model)

    def capture(
        self,
        given: ForwardInputs,
        taps: Sequence[Tap],
        *,
        logits: bool,
        base: bool = False,
        extra: Mapping[str, Any] | None = None,
    ) -> Captured:
        """One no-grad eval forward over ``given`` recording ``taps`` (and the logits when ``logits``).

        ``base``: run the base model (``find_base_model``) instead of the
        causal LM, so no LM head runs; ``Captured.last_hidden`` is its output.
        ``extra``: further keyword inputs of the model's forward (passed when
        it takes them). ``ValueError`` for packing without ``position_ids``,
        a model whose forward takes none, or a FlashAttention model given more
        than one row; ``RuntimeError`` when a tapped module never ran.
        """
        module = self._base if base else self.model
        with self._lock:
            inputs = {**self._model_inputs(given), **self._accepted({**_FORWARD_FLAGS, **(extra or {})}, module)}
            if not logits and not base:
                # The logits are not wanted: compute the LM head for one position only, when the model allows.
                inputs.update(self._accepted({"logits_to_keep": 1}, module, declared_only=True))
            return self._run(module, inputs, taps, logits)

    def _accepted(self, kwargs: Mapping[str, Any], module: nn.Module, *, declared_only: bool = False) -> dict[str, Any]:
        parameters = inspect.signature(module.forward).parameters
        if not declared_only and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            return dict(kwargs)
        return {name: value for name, value in kwargs.items() if name in parameters}

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

    def _run(self, runs: nn.Module, inputs: dict[str, Any], taps: Sequence[Tap], logits: bool) -> Captured:
        slots = sum(tap.slot is not None for tap in taps)
        buffer: list[torch.Tensor] = []
        states: dict[Hashable, torch.Tensor] = {}
        ran: set[Hashable] = set()

        def record(tap: Tap, hidden: torch.Tensor) -> None:
            ran.add(tap.key)
            if tap.slot is None:
                states[tap.key] = hidden
                return
            # Only the copy is kept: holding the module's own output too would keep every captured layer alive.
            hidden = _collapse_streams(hidden)
            width = hidden.shape[-1]
            if not buffer:
                buffer.append(hidden.new_empty((*hidden.shape[:-1], slots * width)))
            buffer[0][..., tap.slot * width : (tap.slot + 1) * width].copy_(hidden)

        def hook(tap: Tap) -> Any:
            if tap.take_input:

                def pre_hook(module: nn.Module, args: tuple[Any, ...]) -> None:
                    if not args:
                        raise RuntimeError(f"the module tapped for {tap.key!r} got no positional input")
                    record(tap, _hidden(args[0]))

                return tap.module.register_forward_pre_hook(pre_hook)
            return tap.module.register_forward_hook(lambda module, args, output: record(tap, _hidden(output)))

        handles = []
        modes = [(module, module.training) for module in self.model.modules()]
        try:
            handles.extend(hook(tap) for tap in taps)
            self.model.eval()
            with torch.no_grad():
                outputs = runs(**inputs)
        finally:
            for handle in handles:
                handle.remove()
            for module, training in modes:
                module.training = training
        missing = [tap.key for tap in taps if tap.key not in ran]
        if missing:
            raise RuntimeError(f"the forward of {type(self.model).__name__} never ran the module(s) for {missing}")
        found = last_hidden = None
        if runs is not self.model:
            last_hidden = _hidden(outputs)
        elif logits:
            found = outputs.logits if hasattr(outputs, "logits") else outputs[0]
        return Captured(buffer[0] if buffer else None, states, found, last_hidden)
