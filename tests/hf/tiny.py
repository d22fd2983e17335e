"""Tiny randomly initialised Hugging Face causal LMs (no download), for the HF backend tests."""

from __future__ import annotations

import torch
import transformers

VOCAB = 128
HIDDEN = 32

# family -> (config class, model class); configs differ in norms, biases, qk-norm and sliding windows.
FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
}


def tiny_model(family: str = "llama", *, layers: int = 8, seed: int = 0) -> torch.nn.Module:
    """A seeded random-init ``<Family>ForCausalLM``: hidden 32, ``layers`` decoder layers, vocab 128, eval mode."""
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
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    return model.eval()


def prompts(batch: int = 2, length: int = 12, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, loss_mask)``; the last row is right-padded, the first quarter unsupervised."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(VOCAB, (batch, length), generator=generator)
    attention_mask = torch.ones(batch, length, dtype=torch.long)
    attention_mask[-1, length * 2 // 3 :] = 0
    loss_mask = attention_mask.clone()
    loss_mask[:, : length // 4] = 0
    return input_ids, attention_mask, loss_mask


def reference_forward(
    model: torch.nn.Module, aux_layer_ids: tuple[int, ...], **inputs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(aux_hidden_states, logits)`` from the model's own ``output_hidden_states=True`` forward."""
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True, use_cache=False)
    return torch.cat([out.hidden_states[i + 1] for i in aux_layer_ids], dim=-1), out.logits


def hook_count(model: torch.nn.Module) -> int:
    """Forward hooks registered on the model's modules, all of them."""
    return sum(len(module._forward_hooks) for module in model.modules())
