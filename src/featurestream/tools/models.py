"""A tiny real target model and a tiny EAGLE-3-style draft head, for demos and tests (CPU, seeded).

``TinyTargetModel`` is a small causal transformer (pre-norm blocks, causal
self-attention, learned positions). Its ``generate_batch`` implements the
producer's backend protocol: one forward, returning the hidden states of a
low, a middle and the top layer concatenated (``aux_hidden_states``,
``[B, T, 3H]``) and the logits (``[B, T, V]``), in the EAGLE-3 token
alignment (``logits``, ``input_ids`` and ``loss_mask`` shifted one position
left, see ``featurestream.pipeline.eagle3``).

``tiny_hf_causal_lm`` builds the same-sized target from a real Hugging Face
architecture (Llama, Qwen2, Qwen3, Mistral; random init, no download; needs
``featurestream[hf]``), to be wrapped in
``featurestream.pipeline.hf.HFEagle3TargetModel``.

``TinyEagle3Draft`` is the EAGLE-3 recipe shrunk down: it fuses the three
target layers into one feature per position, combines the feature at ``t``
with the embedding of token ``t+1`` (the batch's shifted ``input_ids[t]``),
runs one causal decoder layer and predicts the target's distribution at
``t+1`` (the shifted ``logits[t]``). Its loss is the soft cross-entropy
against the target's distribution, masked by the shifted ``loss_mask`` and
``attention_mask`` (and ``position_mask`` with ``target_probs`` supervision).

``TinyDFlashTarget`` and ``TinyDSparkTarget`` drive the same tiny
transformer as DFlash and DSpark target backends (its three tapped layers as
the context, and for DSpark its final-norm output). ``TinyDFlashDraft`` and
``TinyDSparkDraft`` are those recipes shrunk down: from the context feature
and the token at an anchor ``t`` they draft the block of tokens ``t+1 ..
t+block_size`` in parallel (hard-label cross-entropy, unshifted batches);
the DSpark draft adds the total-variation distance between its first
position's distribution and the target's own next-token distribution (the
target's LM head applied to ``target_last_hidden_states``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from featurestream.pipeline.alignment import packed_attention_allowed
from featurestream.pipeline.dflash import DFlashTargetBackend, DFlashTargetBatch
from featurestream.pipeline.dspark import DSparkTargetBackend, DSparkTargetBatch
from featurestream.pipeline.eagle3 import Eagle3ForwardBackend, Eagle3TargetBatch
from featurestream.pipeline.features import ForwardInputs, TargetInputs

__all__ = [
    "HF_FAMILIES",
    "TinyConfig",
    "TinyDFlashDraft",
    "TinyDFlashTarget",
    "TinyDSparkDraft",
    "TinyDSparkTarget",
    "TinyEagle3Draft",
    "TinyTargetModel",
    "prompt_batches",
    "tiny_hf_causal_lm",
]

# family -> (config class, model class) in ``transformers``.
HF_FAMILIES: dict[str, tuple[str, str]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
}


@dataclasses.dataclass(frozen=True)
class TinyConfig:
    """Sizes shared by the target and its draft head."""

    vocab_size: int = 256
    hidden_size: int = 64
    num_layers: int = 4
    num_heads: int = 4
    max_seq_len: int = 128

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TinyConfig.{field.name} must be a positive int, got {value!r}")
        if self.num_layers < 3:
            raise ValueError(f"TinyConfig.num_layers must be >= 3 (three auxiliary layers), got {self.num_layers}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")

    @property
    def aux_layers(self) -> tuple[int, int, int]:
        """Which block outputs EAGLE-3 taps: a low, a middle and the top one."""
        return (0, self.num_layers // 2, self.num_layers - 1)


class _Block(nn.Module):
    """Pre-norm transformer block with causal self-attention."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
        """``allowed [B, T, T]``: which keys each query may attend to (it must include the query itself);
        ``None``: plain causal attention."""
        batch, length, hidden = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        if allowed is None:
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, hidden))
        return x + self.mlp(self.norm2(x))


class TinyTargetModel(nn.Module, Eagle3ForwardBackend):
    """A seeded causal transformer exposing three auxiliary hidden states and logits (an EAGLE-3 target backend)."""

    def __init__(self, config: TinyConfig | None = None, *, seed: int = 0) -> None:
        super().__init__()
        self.config = config = config or TinyConfig()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
            self.positions = nn.Embedding(config.max_seq_len, config.hidden_size)
            self.blocks = nn.ModuleList(_Block(config.hidden_size, config.num_heads) for _ in range(config.num_layers))
            self.norm = nn.LayerNorm(config.hidden_size)
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            # A sharper output distribution than the default init gives the draft something to learn.
            nn.init.normal_(self.lm_head.weight, std=3.0 / config.hidden_size**0.5)
        self.eval()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits [B, T, V], aux_hidden_states [B, T, 3H])`` for ``input_ids [B, T]``, not shifted.

        With ``seq_lens`` (packing) each document attends to itself only and ``attention_mask`` is not used.
        """
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        last_hidden, aux_hidden_states = self.states(ForwardInputs(input_ids, mask, position_ids, seq_lens))
        return self.lm_head(last_hidden), aux_hidden_states

    def states(self, inputs: ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """``(final-norm output [B, T, H], aux_hidden_states [B, T, 3H])`` for ``inputs``: ``forward`` without the
        LM head."""
        input_ids = inputs.input_ids
        length = input_ids.shape[1]
        if length > self.config.max_seq_len:
            raise ValueError(f"sequence length {length} exceeds max_seq_len {self.config.max_seq_len}")
        position_ids = inputs.position_ids
        if position_ids is None:
            position_ids = torch.arange(length, device=input_ids.device).expand_as(input_ids)
        allowed = None
        if inputs.seq_lens is not None:
            allowed = packed_attention_allowed(inputs.seq_lens.to(input_ids.device), length)
        elif not bool(inputs.attention_mask.all()):
            causal = torch.ones(length, length, dtype=torch.bool, device=input_ids.device).tril()
            # A padded query row would see no key at all; letting it see itself keeps softmax finite.
            itself = torch.eye(length, dtype=torch.bool, device=input_ids.device)
            allowed = (causal & inputs.attention_mask.bool()[:, None, :]) | itself
        x = self.embed(input_ids) + self.positions(position_ids)
        taps = []
        for index, block in enumerate(self.blocks):
            x = block(x, allowed)
            if index in self.config.aux_layers:
                taps.append(x)
        return self.norm(x), torch.cat(taps, dim=-1)

    def get_input_embeddings(self) -> nn.Module:
        """The token embedding (a draft head may copy or share it)."""
        return self.embed

    def forward_features(self, inputs: ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """``(aux_hidden_states, logits)``, not shifted: ``generate_batch`` (the producer's backend protocol)
        aligns them."""
        last_hidden, aux_hidden_states = self.states(inputs)
        return aux_hidden_states, self.lm_head(last_hidden)


class _TinyContextTarget:
    """What the tiny DFlash and DSpark targets share: a ``TinyTargetModel`` and its no-grad forward."""

    def __init__(self, config: TinyConfig | None = None, *, seed: int = 0) -> None:
        self.model = TinyTargetModel(config, seed=seed)

    def get_input_embeddings(self) -> nn.Module:
        """The target's token embedding."""
        return self.model.embed

    def get_output_embeddings(self) -> nn.Module:
        """The target's LM head (the DSpark draft copies it)."""
        return self.model.lm_head

    def _states(self, inputs: ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            return self.model.states(inputs)


class TinyDFlashTarget(_TinyContextTarget, DFlashTargetBackend):
    """``TinyTargetModel`` as a DFlash target: its three tapped layers' outputs as ``hidden_states [B, T, 3H]``."""

    def target_batch(self, inputs: TargetInputs) -> DFlashTargetBatch:
        """One no-grad forward; every feature in the input's positions (DFlash shifts nothing)."""
        _, context = self._states(inputs)
        return inputs.batch(DFlashTargetBatch, hidden_states=context)


class TinyDSparkTarget(_TinyContextTarget, DSparkTargetBackend):
    """``TinyTargetModel`` as a DSpark target: the three tapped layers' outputs and the final-norm output."""

    def target_batch(self, inputs: TargetInputs) -> DSparkTargetBatch:
        """One no-grad forward; every feature in the input's positions (DSpark shifts nothing)."""
        last_hidden, context = self._states(inputs)
        return inputs.batch(DSparkTargetBatch, target_hidden_states=context, target_last_hidden_states=last_hidden)


def tiny_hf_causal_lm(
    family: str, config: TinyConfig | None = None, *, num_layers: int = 8, seed: int = 0
) -> nn.Module:
    """A seeded, randomly initialised ``transformers`` ``<Family>ForCausalLM`` sized like ``config``, in eval mode.

    Hidden size, attention heads (half as many key/value heads when even),
    vocabulary and context length come from ``config``; ``num_layers`` decoder
    layers (8: the EAGLE-3 recipe's auxiliary layers are 1, 3 and 4), an
    untied LM head re-initialised as sharply as ``TinyTargetModel``'s.
    ``ImportError`` naming the ``featurestream[hf]`` extra without transformers.
    """
    config = config or TinyConfig()
    if family not in HF_FAMILIES:
        raise ValueError(f"unknown Hugging Face family {family!r}; choose one of {sorted(HF_FAMILIES)}")
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(
            f"the hf-{family} target needs Hugging Face transformers: pip install 'featurestream[hf]'"
        ) from exc
    config_name, model_name = HF_FAMILIES[family]
    heads = config.num_heads
    hf_config = getattr(transformers, config_name)(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=4 * config.hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2 if heads % 2 == 0 else heads,
        head_dim=config.hidden_size // heads,
        max_position_embeddings=config.max_seq_len,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = getattr(transformers, model_name)(hf_config)
        nn.init.normal_(model.get_output_embeddings().weight, std=3.0 / config.hidden_size**0.5)
    return model.eval()


class TinyEagle3Draft(nn.Module):
    """A one-layer EAGLE-3-style draft head trained on a target's streamed features."""

    def __init__(self, config: TinyConfig | None = None, *, seed: int = 0) -> None:
        super().__init__()
        self.config = config = config or TinyConfig()
        hidden = config.hidden_size
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.fuse = nn.Linear(3 * hidden, hidden)
            self.embed = nn.Embedding(config.vocab_size, hidden)
            self.combine = nn.Linear(2 * hidden, hidden)
            self.block = _Block(hidden, config.num_heads)
            self.norm = nn.LayerNorm(hidden)
            self.lm_head = nn.Linear(hidden, config.vocab_size, bias=False)

    def forward(self, aux_hidden_states: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, T, V]`` from a batch in the EAGLE-3 alignment: position ``t`` combines the target's
        feature at ``t`` with ``input_ids[t]`` (token ``t+1``) and predicts the target's distribution at ``t+1``."""
        feature = self.fuse(aux_hidden_states)
        token = self.embed(input_ids)
        x = self.block(self.combine(torch.cat([token, feature], dim=-1)), None)
        return self.lm_head(self.norm(x))

    def loss(self, batch: Eagle3TargetBatch) -> torch.Tensor:
        """Masked soft cross-entropy between the draft's and the target's next-token distributions.

        ``batch.logits`` / ``target_probs`` and ``loss_mask`` are already shifted (``logits[t]`` is the
        target's at ``t+1``; the zero-filled last position has ``loss_mask`` 0); ``attention_mask`` is not,
        and masks the positions whose feature is padding."""
        logits = self(batch.aux_hidden_states, batch.input_ids)
        if batch.logits is not None:
            target = batch.logits.float().softmax(dim=-1)
            mask = batch.loss_mask.float()
        else:
            assert batch.target_probs is not None and batch.position_mask is not None
            target = batch.target_probs.float()
            mask = batch.loss_mask.float() * batch.position_mask.float()
        mask = mask * batch.attention_mask.float()
        per_token = -(target * logits.log_softmax(dim=-1)).sum(dim=-1)
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)


class TinyDFlashDraft(nn.Module):
    """A one-layer DFlash-style draft head: from the target's context at an anchor, a block of tokens at once.

    ``context_layers``: how many target layers the context concatenates (its
    width is ``context_layers * H``); ``block_size``: tokens drafted per anchor.
    """

    def __init__(
        self, config: TinyConfig | None = None, *, context_layers: int = 3, block_size: int = 2, seed: int = 0
    ) -> None:
        super().__init__()
        self.config = config = config or TinyConfig()
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        self.block_size = block_size
        hidden = config.hidden_size
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.fuse = nn.Linear(context_layers * hidden, hidden)
            self.embed = nn.Embedding(config.vocab_size, hidden)
            self.combine = nn.Linear(2 * hidden, hidden)
            self.block = _Block(hidden, config.num_heads)
            self.offsets = nn.Embedding(block_size, hidden)
            self.norm = nn.LayerNorm(hidden)
            self.lm_head = nn.Linear(hidden, config.vocab_size, bias=False)

    def forward(
        self, context: torch.Tensor, input_ids: torch.Tensor, seq_lens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits ``[B, T, block_size, V]``: entry ``[:, t, k]`` drafts token ``t + 1 + k`` from the context and
        token at ``t`` (attending to earlier anchors of its own document only)."""
        allowed = None if seq_lens is None else packed_attention_allowed(seq_lens, input_ids.shape[1])
        x = self.block(self.combine(torch.cat([self.embed(input_ids), self.fuse(context)], dim=-1)), allowed)
        return self.lm_head(self.norm(x[:, :, None, :] + self.offsets.weight))

    def block_weights(
        self, input_ids: torch.Tensor, mask: torch.Tensor, doc_remaining: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(targets, weights)``, both ``[B, T, block_size]``: token ``t + 1 + k`` and whether it is supervised
        (``mask`` at ``t + 1 + k``, inside the sequence and, when packed, inside the anchor's document)."""
        length = input_ids.shape[1]
        targets = torch.zeros(*input_ids.shape, self.block_size, dtype=input_ids.dtype, device=input_ids.device)
        weights = torch.zeros(targets.shape, dtype=torch.float32, device=input_ids.device)
        for k in range(self.block_size):
            ahead = k + 1
            targets[:, : length - ahead, k] = input_ids[:, ahead:]
            weights[:, : length - ahead, k] = mask[:, ahead:].float()
            if doc_remaining is not None:
                weights[:, :, k] *= (doc_remaining >= ahead).float()
        return targets, weights

    def block_cross_entropy(
        self, logits: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor, doc_remaining: torch.Tensor | None
    ) -> torch.Tensor:
        """The mean hard-label cross-entropy of the drafted blocks over their supervised tokens."""
        targets, weights = self.block_weights(input_ids, mask, doc_remaining)
        per_token = F.cross_entropy(logits.flatten(0, 2).float(), targets.flatten(), reduction="none")
        return (per_token * weights.flatten()).sum() / weights.sum().clamp(min=1.0)

    def loss(self, batch: DFlashTargetBatch) -> torch.Tensor:
        """The block cross-entropy over tokens the batch supervises (``loss_mask`` and ``attention_mask``)."""
        logits = self(batch.hidden_states.float(), batch.input_ids, batch.seq_lens)
        mask = batch.loss_mask.float() * batch.attention_mask.float()
        return self.block_cross_entropy(logits, batch.input_ids, mask, batch.doc_remaining)


class TinyDSparkDraft(TinyDFlashDraft):
    """``TinyDFlashDraft`` plus DSpark's distillation: a frozen copy of the target's LM head turns
    ``target_last_hidden_states[t]`` into the target's distribution of token ``t + 1``, which the first drafted
    position is pulled towards (total-variation distance)."""

    def __init__(
        self,
        config: TinyConfig | None = None,
        *,
        target_lm_head: nn.Module,
        context_layers: int = 3,
        block_size: int = 2,
        seed: int = 0,
    ) -> None:
        super().__init__(config, context_layers=context_layers, block_size=block_size, seed=seed)
        weight = getattr(target_lm_head, "weight", None)
        expected = (self.config.vocab_size, self.config.hidden_size)
        if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != expected:
            raise ValueError(f"target_lm_head must have a weight of shape {expected}, got {target_lm_head!r}")
        self.target_lm_head = nn.Linear(self.config.hidden_size, self.config.vocab_size, bias=False)
        with torch.no_grad():
            self.target_lm_head.weight.copy_(weight.detach().float())
        self.target_lm_head.requires_grad_(False)

    def loss(self, batch: DSparkTargetBatch) -> torch.Tensor:  # type: ignore[override]
        """Block cross-entropy plus the total-variation distance to the target's next-token distribution, both
        over the tokens ``loss_mask`` supervises."""
        logits = self(batch.target_hidden_states.float(), batch.input_ids, batch.seq_lens)
        cross_entropy = self.block_cross_entropy(logits, batch.input_ids, batch.loss_mask, batch.doc_remaining)
        with torch.no_grad():
            target = self.target_lm_head(batch.target_last_hidden_states.float()).softmax(dim=-1)
        distance = 0.5 * (logits[:, :, 0].float().softmax(dim=-1) - target).abs().sum(dim=-1)
        _, weights = self.block_weights(batch.input_ids, batch.loss_mask, batch.doc_remaining)
        first = weights[:, :, 0]
        return cross_entropy + (distance * first).sum() / first.sum().clamp(min=1.0)


def prompt_batches(
    count: int, *, batch_size: int = 4, seq_len: int = 32, vocab_size: int = 256, seed: int = 0
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``count`` seeded prompts ``(input_ids, attention_mask, loss_mask)``, each ``[batch_size, seq_len]`` long.

    Tokens take small random steps from their predecessor (a random walk
    modulo the vocabulary, so text has local structure the models can pick
    up); the first quarter of each row is an unsupervised "prompt"
    (``loss_mask`` 0) and some rows end in padding.
    """
    generator = torch.Generator().manual_seed(seed)
    for _ in range(count):
        steps = torch.randint(-4, 5, (batch_size, seq_len), generator=generator)
        steps[:, 0] = torch.randint(vocab_size, (batch_size,), generator=generator)
        ids = steps.cumsum(dim=1) % vocab_size
        lengths = torch.randint(seq_len * 3 // 4, seq_len + 1, (batch_size,), generator=generator)
        attention = (torch.arange(seq_len)[None, :] < lengths[:, None]).long()
        loss = attention.clone()
        loss[:, : seq_len // 4] = 0
        yield ids * attention, attention, loss
