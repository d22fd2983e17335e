"""Tiny randomly initialised Hugging Face causal LMs (no download), for the HF backend tests."""

from __future__ import annotations

import torch
import transformers

from featurestream.pipeline.hf import find_decoder_layers

VOCAB = 128
HIDDEN = 32

# family -> (config class, model class); configs differ in norms, biases, qk-norm and sliding windows.
FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
}


def tiny_model(
    family: str = "llama", *, layers: int = 8, seed: int = 0, tied: bool = False, dtype: torch.dtype = torch.float32
) -> torch.nn.Module:
    """A seeded random-init ``<Family>ForCausalLM``: hidden 32, ``layers`` decoder layers, vocab 128, eval mode;
    ``tied``: the LM head is the embedding; ``dtype``: the parameters' dtype."""
    config_class, model_class = FAMILIES[family]
    config = config_class(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=HIDDEN // 4,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    return model.to(dtype).eval()


def prompts(batch: int = 2, length: int = 12, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, loss_mask)``; the last row is right-padded, the first quarter unsupervised."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(VOCAB, (batch, length), generator=generator)
    attention_mask = torch.ones(batch, length, dtype=torch.long)
    attention_mask[-1, length * 2 // 3 :] = 0
    loss_mask = attention_mask.clone()
    loss_mask[:, : length // 4] = 0
    return input_ids, attention_mask, loss_mask


def shifted(tensor: torch.Tensor) -> torch.Tensor:
    """The EAGLE-3 token alignment: one position left along dim 1, the last position zero."""
    return torch.cat([tensor[:, 1:], torch.zeros_like(tensor[:, :1])], dim=1)


def reference_forward(
    model: torch.nn.Module, aux_layer_ids: tuple[int, ...], **inputs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(aux_hidden_states, logits)`` an EAGLE-3 batch of the model must carry, from its own forward.

    The aux states are ``output_hidden_states=True``'s ``hidden_states[i + 1]``, except for the last layer, whose
    entry there is the final norm's output: its own output is recorded by a hook. The logits are shifted.
    """
    last = model.config.num_hidden_layers - 1
    recorded: list[torch.Tensor] = []
    handle = None
    if last in aux_layer_ids:
        layers = find_decoder_layers(model)
        handle = layers[last].register_forward_hook(lambda module, args, output: recorded.append(output))
    try:
        with torch.no_grad():
            out = model(**inputs, output_hidden_states=True, use_cache=False)
    finally:
        if handle is not None:
            handle.remove()

    def state(layer: int) -> torch.Tensor:
        if layer != last:
            return out.hidden_states[layer + 1]
        output = recorded[0]
        return output[0] if isinstance(output, tuple) else output

    return torch.cat([state(i) for i in aux_layer_ids], dim=-1), shifted(out.logits)


def hook_count(model: torch.nn.Module) -> int:
    """Forward hooks registered on the model's modules, all of them."""
    return sum(len(module._forward_hooks) for module in model.modules())
