"""Opt-in 8-bit hidden states (lossy): ``float8_e4m3fn`` with one float32 scale per token.

``FeatureProducer(..., fp8=True)`` stores every floating feature whose name
ends in ``hidden_states`` (``HIDDEN_STATE_SUFFIX``: EAGLE-3's
``aux_hidden_states`` and ``last_hidden_states``, DFlash's
``hidden_states``, EAGLE-1/2's and DSpark's states) as ``q = x / s`` in
``float8_e4m3fn`` beside ``<name>_fp8_scale [..., 1]`` float32, ``s`` the
token's largest magnitude over 448 (e4m3's largest finite value), and
records ``provenance["fp8"] = "<name>:<dtype>,..."``. The loader
dequantises to ``(q * s).to(dtype)``, the dtype the producer had. Logits and
draft-vocab probabilities are never quantised.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from featurestream.common.refs import FP8_KEY, FP8_SCALE_SUFFIX, FeatureSpec, SampleRef, fp8_features

__all__ = ["HIDDEN_STATE_SUFFIX", "dequantize", "quantize", "stored_specs"]

HIDDEN_STATE_SUFFIX = "hidden_states"
_E4M3 = torch.float8_e4m3fn
_E4M3_MAX = torch.finfo(_E4M3).max
_DTYPES = {str(dtype).removeprefix("torch."): dtype for dtype in (torch.float16, torch.bfloat16, torch.float32)}


def quantize(tensors: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``tensors`` with each float16/bfloat16/float32 ``*hidden_states`` feature as ``float8_e4m3fn`` followed by
    its per-token scale, and the provenance entry naming them with their dtypes (none when nothing qualifies)."""
    stored: dict[str, torch.Tensor] = {}
    quantized: list[str] = []
    for name, tensor in tensors.items():
        if not name.endswith(HIDDEN_STATE_SUFFIX) or tensor.dtype not in _DTYPES.values():
            stored[name] = tensor
            continue
        wide = tensor.float()
        scale = wide.abs().amax(dim=-1, keepdim=True) / _E4M3_MAX
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero token stays zero
        stored[name] = (wide / scale).to(_E4M3)
        stored[name + FP8_SCALE_SUFFIX] = scale
        quantized.append(f"{name}:{str(tensor.dtype).removeprefix('torch.')}")
    return stored, ({FP8_KEY: ",".join(quantized)} if quantized else {})


def stored_specs(ref: SampleRef) -> dict[str, FeatureSpec]:
    """``ref``'s specs as the producer had them: each 8-bit feature in its own dtype, the scales left out."""
    restored = fp8_features(ref.provenance or {})
    specs: dict[str, FeatureSpec] = {}
    for name, spec in ref.feature_specs.items():
        if name in restored:
            specs[name] = FeatureSpec(spec.shape, _DTYPES[restored[name]])
        elif not (name.endswith(FP8_SCALE_SUFFIX) and name.removesuffix(FP8_SCALE_SUFFIX) in restored):
            specs[name] = spec
    return specs


def dequantize(ref: SampleRef, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` of ``ref`` with each 8-bit feature dequantised to its producer's dtype and its scale dropped."""
    restored = fp8_features(ref.provenance or {})
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if name in restored:
            out[name] = (tensor.float() * tensors[name + FP8_SCALE_SUFFIX]).to(_DTYPES[restored[name]])
        elif not (name.endswith(FP8_SCALE_SUFFIX) and name.removesuffix(FP8_SCALE_SUFFIX) in restored):
            out[name] = tensor
    return out
