"""``TargetHead``: the target model's LM head on the trainer's side, for samples that carry its last hidden state.

A sample supervised by the target's hidden state (``supervision="hidden"``
on a Hugging Face backend, see ``featurestream.pipeline.supervision``)
stores the final norm's output instead of the logits; the trainer's loader
rebuilds the logits with the same head: ``head.logits(h)`` is
``F.linear(h, weight)``, the very op a Hugging Face causal LM's
``lm_head`` runs, so with the same weight and dtype on the same device the
rebuilt logits are the model's own bit for bit.

A head is built from a loaded model (``TargetHead.from_model``, the tied
embedding included) or from a checkpoint directory without loading the
model (``TargetHead.from_pretrained``: only the head's weight is read from
its safetensors shard). Its ``fingerprint`` (shape, dtype and a hash of the
weight) is what a producer records on each ref, so a loader refuses a head
that is not the one the sample was produced with.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from featurestream.stores.safetensors_codec import DTYPES

__all__ = ["TargetHead"]

# Where a Hugging Face checkpoint keeps the LM head's weight, and, for a tied head, the embedding it shares.
_HEAD_KEYS = ("lm_head.weight", "language_model.lm_head.weight", "embed_out.weight")
_EMBEDDING_KEYS = (
    "model.embed_tokens.weight",
    "model.language_model.embed_tokens.weight",
    "language_model.model.embed_tokens.weight",
    "transformer.wte.weight",
    "gpt_neox.embed_in.weight",
)
_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"
# The dtypes a head's weight may be stored in (narrower floats cannot run F.linear here).
_HEAD_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
# Config entries that make a model's logits something other than its head applied to the final norm's output.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")
_HASH_CHUNK = 1 << 24


class TargetHead:
    """A target model's LM head: ``logits(h) = F.linear(h, weight)`` for ``weight [V, H]``.

    ``weight`` must be a floating 2-D tensor; it is detached, not copied.
    ``source`` names where it came from (shown in errors). ``fingerprint``
    is ``"<V>x<H>:<dtype>:<hash>"``, the hash (BLAKE2b, 128 bits) over the
    weight's bytes, computed once. Thread-safe: the weight is never
    modified.
    """

    def __init__(self, weight: torch.Tensor, *, source: str = "weight") -> None:
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"TargetHead weight must be a torch.Tensor, got {type(weight).__name__}")
        if weight.dim() != 2 or not weight.is_floating_point() or weight.numel() == 0:
            raise ValueError(
                f"TargetHead weight must be a non-empty floating [vocab, hidden] matrix, got shape "
                f"{tuple(weight.shape)} of {weight.dtype}"
            )
        self.weight = weight.detach()
        self.source = source
        self._fingerprint: str | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_model(cls, model: nn.Module) -> TargetHead:
        """The head of a loaded Hugging Face causal LM (``get_output_embeddings()``; a tied one is the embedding).

        ``ValueError`` for a model without an LM head, with a head bias, or
        whose logits are more than the head's output (a config with
        ``final_logit_softcapping``, ``logit_scale`` ...).
        """
        getter = getattr(model, "get_output_embeddings", None)
        head = getter() if callable(getter) else None
        if head is None:
            raise ValueError(
                f"{type(model).__name__} has no LM head (get_output_embeddings() is missing or None); load it with "
                "AutoModelForCausalLM"
            )
        if getattr(head, "bias", None) is not None:
            raise ValueError(f"{type(model).__name__}'s LM head has a bias; TargetHead rebuilds bias-free heads only")
        check_plain_logits(getattr(model, "config", None), type(model).__name__)
        return cls(head.weight, source=f"{type(model).__name__}.{type(head).__name__}")

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str], *, device: torch.device | str = "cpu") -> TargetHead:
        """The head of a saved Hugging Face checkpoint, reading its weight alone.

        ``path`` is a directory with ``model.safetensors`` or a sharded
        ``model.safetensors.index.json``; only the shard holding the head
        is opened, and of it only its header and the head's bytes are read.
        A checkpoint without ``lm_head.weight`` whose ``config.json`` ties
        the embeddings gives the embedding's weight. ``FileNotFoundError``
        for a directory without safetensors weights; ``ValueError`` when the
        head cannot be found or the config transforms the logits.
        """
        root = os.fspath(path)
        config_path = os.path.join(root, "config.json")
        config = _read_json(config_path) if os.path.exists(config_path) else {}
        text_config = config.get("text_config", config)
        check_plain_logits(text_config, root)
        where = _tensor_files(root)
        key = next((name for name in _HEAD_KEYS if name in where), None)
        if key is None and text_config.get("tie_word_embeddings", config.get("tie_word_embeddings", False)):
            key = next((name for name in _EMBEDDING_KEYS if name in where), None)
        if key is None:
            raise ValueError(
                f"{root} has no LM head: none of {list(_HEAD_KEYS)} is in its safetensors weights, and its config "
                f"does not tie the embeddings to one of {list(_EMBEDDING_KEYS)}"
            )
        weight = read_safetensor(os.path.join(root, where[key]), key)
        return cls(weight.to(device), source=f"{root}:{key}")

    @property
    def vocab_size(self) -> int:
        """``V``: the last dimension of the logits."""
        return int(self.weight.shape[0])

    @property
    def hidden_size(self) -> int:
        """``H``: the last dimension of the hidden state the head takes."""
        return int(self.weight.shape[1])

    @property
    def dtype(self) -> torch.dtype:
        """The weight's dtype, which the hidden state and the logits share."""
        return self.weight.dtype

    @property
    def fingerprint(self) -> str:
        """``"<V>x<H>:<dtype>:<hash>"``: two heads with equal fingerprints give equal logits."""
        with self._lock:
            if self._fingerprint is None:
                self._fingerprint = (
                    f"{self.vocab_size}x{self.hidden_size}:{_dtype_name(self.dtype)}:{_hash(self.weight)}"
                )
            return self._fingerprint

    def to(self, device: torch.device | str) -> TargetHead:
        """This head on ``device`` (itself when already there); the fingerprint carries over."""
        device = torch.device(device)
        if self.weight.device == device:
            return self
        moved = TargetHead(self.weight.to(device), source=self.source)
        moved._fingerprint = self._fingerprint
        return moved

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``F.linear(hidden, weight)``: ``[..., H] -> [..., V]`` on the weight's device. ``ValueError`` for a
        hidden state of another width or dtype."""
        if hidden.shape[-1] != self.hidden_size or hidden.dtype != self.dtype:
            raise ValueError(
                f"TargetHead {self.source} takes [..., {self.hidden_size}] {self.dtype} hidden states, got "
                f"{list(hidden.shape)} {hidden.dtype}"
            )
        with torch.no_grad():
            return nn.functional.linear(hidden.to(self.weight.device), self.weight)

    def __repr__(self) -> str:
        return f"TargetHead({self.source}, {self.vocab_size}x{self.hidden_size}, {self.dtype})"


def check_plain_logits(config: Any, owner: str) -> None:
    """``ValueError`` naming ``owner`` and the entry when ``config`` (an object or a dict) says the model's
    logits are transformed after its head (soft-capping, scaling): a bare head would not rebuild them."""
    for name in _LOGIT_TRANSFORMS:
        value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
        if value not in (None, 1, 1.0):
            raise ValueError(
                f"{owner}'s config sets {name}={value!r}: its logits are not its LM head's output alone, so they "
                "cannot be rebuilt from the hidden state; use supervision='logits'"
            )


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _hash(weight: torch.Tensor) -> str:
    """BLAKE2b-128 of the weight's bytes in row-major order, read a block of rows at a time (so a strided or
    device weight is never copied whole)."""
    digest = hashlib.blake2b(digest_size=16)
    rows = max(1, _HASH_CHUNK // max(1, weight.shape[1] * weight.element_size()))
    for start in range(0, weight.shape[0], rows):
        block = weight[start : start + rows].detach().contiguous().cpu()
        digest.update(block.view(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def _read_json(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as file:
        value = json.load(file)
    if not isinstance(value, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(value).__name__}")
    return value


def _tensor_files(root: str) -> dict[str, str]:
    """Tensor name -> the file (relative to ``root``) that holds it: the index's map, else the single file's names."""
    index = os.path.join(root, _INDEX)
    if os.path.exists(index):
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index} has no weight_map object")
        return {str(name): str(file) for name, file in weight_map.items()}
    single = os.path.join(root, _SINGLE)
    if not os.path.exists(single):
        raise FileNotFoundError(f"{root} holds neither {_INDEX} nor {_SINGLE}")
    with open(single, "rb") as file:
        header, _ = _header(file, single)
    return {name: _SINGLE for name in header if name != "__metadata__"}


def _header(file: Any, path: str) -> tuple[dict[str, Any], int]:
    """A safetensors file's header and the offset its tensor data starts at."""
    size = int.from_bytes(file.read(8), "little")
    if size <= 0 or size > 1 << 30:
        raise ValueError(f"{path} is not a safetensors file (header length {size})")
    header = json.loads(file.read(size))
    if not isinstance(header, dict):
        raise ValueError(f"{path}'s safetensors header is not a JSON object")
    return header, 8 + size


def read_safetensor(path: str, key: str) -> torch.Tensor:
    """Tensor ``key`` of the safetensors file ``path``, reading only the header and that tensor's bytes.

    ``ValueError`` when the file has no such tensor or stores it in a dtype
    a head cannot have.
    """
    with open(path, "rb") as file:
        header, start = _header(file, path)
        entry = header.get(key)
        if not isinstance(entry, dict):
            raise ValueError(f"{path} has no tensor {key!r}")
        dtype = DTYPES.get(entry.get("dtype", ""))
        if dtype not in _HEAD_DTYPES:
            raise ValueError(f"{path}: {key!r} is stored as {entry.get('dtype')!r}, not a float dtype of a head")
        begin, end = entry["data_offsets"]
        file.seek(start + begin)
        data = bytearray(end - begin)
        if file.readinto(data) != len(data):
            raise ValueError(f"{path} ends inside tensor {key!r}")
    return torch.frombuffer(data, dtype=dtype).reshape(entry["shape"])
