"""The EAGLE-3 feature schema (version 1) and the batch a draft trainer consumes.

A sample carries the core features ``aux_hidden_states`` (the target's
low/mid/high-layer hidden states, concatenated), ``input_ids``,
``attention_mask`` and ``loss_mask``; its supervision is exactly one of
``logits`` or the pair ``target_probs`` + ``position_mask`` (a precomputed
draft-vocabulary encoding); the packing metadata ``position_ids``,
``seq_lens``, ``doc_remaining`` is all-or-none. ``FeatureProducer`` stores
either supervision; ``DraftVocabTarget`` projects a logits-producing target
onto a draft vocabulary (``DraftVocab``) before anything is stored, which
shrinks the supervision from the target's vocabulary to the draft's.

Each feature's dtype and shape has a rule (``EAGLE3_FEATURES``, see
``check_feature_specs``): checked by ``FeatureProducer`` on a backend's
output before anything is stored (``produced_tensors``) and by the loader on
a ref's ``feature_specs`` before the sample is read (``validate_ref``);
either error names the sample, the feature, what was expected and what came.
``validate_eagle3_ref`` checks what the reference's does: the algorithm, the
feature names and the schema version.
An ``Eagle3TargetBatch`` built directly checks only its feature names.

The reference's public names (``EAGLE3_*``, ``eagle3_logits_tensors``,
``eagle3_logits_feature_specs``, ``validate_eagle3_packing_inputs``,
``validate_eagle3_ref``) are defined here; featurestream's shorter names
(``CORE_FEATURES``, ``SCHEMA_VERSION`` ...) are the same objects.
Importing this module registers ``EAGLE3_SCHEMA``, the EAGLE-3
``AlgorithmSchema`` the producer and the loader look up.

Token alignment (the reference's, which its EAGLE-3 trainer expects):
``logits``, ``input_ids`` and ``loss_mask`` are shifted one position left
with the last position zero-filled, so position ``t`` of a batch carries the
target's logits, the token id and the loss mask of position ``t + 1`` next to
``aux_hidden_states[t]``; ``aux_hidden_states``, ``attention_mask`` and the
packing metadata keep the input's positions. ``Eagle3ForwardBackend`` (and so
``HFEagle3TargetModel``) returns batches in this alignment.
"""

from __future__ import annotations

import abc
import dataclasses
import threading
from collections.abc import Iterable, Mapping
from types import MappingProxyType

import torch

from featurestream.common.refs import (
    REQUIRED_FEATURES,
    REQUIRED_SUPERVISION,
    FeatureAlgorithm,
    FeatureSpec,
    SampleRef,
)
from featurestream.pipeline.alignment import shift_left
from featurestream.pipeline.features import (
    ATTENTION_MASK_RULE,
    INPUT_IDS_RULE,
    LOSS_MASK_RULE,
    MASK_DTYPES,
    FeatureBatch,
    FeatureRule,
    FeatureSet,
    ForwardInputs,
    TargetBackendBase,
    TargetInputs,
)
from featurestream.pipeline.schemas import AlgorithmSchema, register

__all__ = [
    "CORE_FEATURES",
    "EAGLE3_CORE_FEATURES",
    "EAGLE3_DRAFT_VOCAB_SUPERVISION",
    "EAGLE3_FEATURES",
    "EAGLE3_LOGITS_SUPERVISION",
    "EAGLE3_PACKING_FEATURES",
    "EAGLE3_SCHEMA",
    "EAGLE3_SCHEMA_VERSION",
    "EAGLE3_SUPERVISION_ENCODINGS",
    "FEATURE_ORDER",
    "LOGITS_SUPERVISION",
    "PACKING_FEATURES",
    "PROBS_SUPERVISION",
    "SCHEMA_VERSION",
    "DraftVocab",
    "DraftVocabTarget",
    "Eagle3ForwardBackend",
    "Eagle3TargetBackend",
    "Eagle3TargetBatch",
    "ForwardInputs",
    "check_feature_names",
    "check_feature_specs",
    "eagle3_logits_feature_specs",
    "eagle3_logits_tensors",
    "feature_tensors",
    "produced_tensors",
    "project_to_draft_vocab",
    "validate_eagle3_packing_inputs",
    "validate_eagle3_ref",
    "validate_ref",
]

EAGLE3_SCHEMA_VERSION = 1
EAGLE3_CORE_FEATURES = REQUIRED_FEATURES[FeatureAlgorithm.EAGLE3]
# ("logits",) and ("target_probs", "position_mask"): the control plane's table (``REQUIRED_SUPERVISION``).
EAGLE3_LOGITS_SUPERVISION, EAGLE3_DRAFT_VOCAB_SUPERVISION = REQUIRED_SUPERVISION[FeatureAlgorithm.EAGLE3]
# The reference's name for the feature set of a logits-supervised sample.
EAGLE3_SUPERVISION_ENCODINGS = EAGLE3_CORE_FEATURES + EAGLE3_LOGITS_SUPERVISION
EAGLE3_PACKING_FEATURES = ("position_ids", "seq_lens", "doc_remaining")

# featurestream's names for the same sets (one definition each, above).
SCHEMA_VERSION = EAGLE3_SCHEMA_VERSION
CORE_FEATURES = EAGLE3_CORE_FEATURES
LOGITS_SUPERVISION = EAGLE3_LOGITS_SUPERVISION
PROBS_SUPERVISION = EAGLE3_DRAFT_VOCAB_SUPERVISION
PACKING_FEATURES = EAGLE3_PACKING_FEATURES
FEATURE_ORDER = CORE_FEATURES + LOGITS_SUPERVISION + PROBS_SUPERVISION + PACKING_FEATURES

# Each feature's dtype and shape (the reference's Eagle3TargetBatch and its trainer): the hidden states, logits and
# draft-vocab probabilities float, token ids integer, masks bool/integer/float; ``aux_hidden_states [B, S, 3H]``,
# ``logits [B, S, V]`` and ``target_probs [B, S, D]`` have a last dimension of any size (neither H nor the
# vocabularies are known here). Which features a sample carries is check_feature_names' business (exactly one
# supervision, packing all-or-none); these rules check only the specs.
_CORE_RULES = (
    FeatureRule("aux_hidden_states", ("floating",), ("B", "S", "*")),
    INPUT_IDS_RULE,
    ATTENTION_MASK_RULE,
    LOSS_MASK_RULE,
    FeatureRule("logits", ("floating",), ("B", "S", "*"), required=False),
    FeatureRule("target_probs", ("floating",), ("B", "S", "*"), required=False),
)
# The packing metadata, unshifted: per-document ``position_ids [B, S]``, document lengths ``seq_lens [B, D]`` and
# ``doc_remaining [B, S]``, which the trainer only compares with the step index (``step < doc_remaining``), so a
# float one works as well as an integer one.
_PACKING_RULES = (
    FeatureRule("position_ids", ("integer",), ("B", "S"), required=False),
    FeatureRule("seq_lens", ("integer",), ("B", "*"), required=False),
    FeatureRule("doc_remaining", ("integer", "floating"), ("B", "S"), required=False),
)


def _rules(position_mask: tuple[int | str, ...]) -> tuple[FeatureRule, ...]:
    rule = FeatureRule("position_mask", MASK_DTYPES, position_mask, required=False)
    return (*_CORE_RULES, rule, *_PACKING_RULES)


# ``position_mask`` is ``[B, S, 1]`` as the reference's remote server and ``DraftVocab.project`` make it; a
# squeezed ``[B, S]`` one (what recipes build from a loss mask) was streamed before these rules and still is.
# Errors quote the reference's ``[B, S, 1]``.
_SQUEEZED_POSITION_MASK_FEATURES = FeatureSet("eagle3", _rules(("B", "S")))


class _Eagle3FeatureSet(FeatureSet):
    """EAGLE-3's rules, whose names follow ``check_feature_names`` (exactly one supervision, packing all-or-none)
    and whose ``position_mask`` may also come squeezed.

    Its ``tensors_of`` checks names only: an ``Eagle3TargetBatch`` built
    directly is not held to the dtype and shape rules (as the reference's is
    not); the producer and the loader apply them (``check_feature_specs``).
    """

    def check_names(self, names: Iterable[str]) -> None:
        check_feature_names(names)

    def check_specs(self, specs: Mapping[str, tuple[tuple[int, ...], torch.dtype]], sample: str | None) -> None:
        position_mask = specs.get("position_mask")
        if position_mask is not None and len(position_mask[0]) == 2:
            _SQUEEZED_POSITION_MASK_FEATURES.check_specs(specs, sample)
        else:
            super().check_specs(specs, sample)

    def tensors_of(self, batch: object, sample: str | None = None) -> dict[str, torch.Tensor]:
        return self.present(batch, sample)


EAGLE3_FEATURES = _Eagle3FeatureSet("eagle3", _rules(("B", "S", 1)))


def check_feature_specs(specs: Mapping[str, tuple[tuple[int, ...], torch.dtype]], sample: str | None = None) -> None:
    """``ValueError`` naming the sample (when given), the feature, what was expected and what came, for the first
    feature (in ``FEATURE_ORDER``) whose dtype or shape breaks its EAGLE-3 rule; ``B`` and ``S`` must agree across
    features. ``specs`` maps feature name -> ``(shape, dtype)``."""
    EAGLE3_FEATURES.check_specs(specs, sample)


_PACKING_TOGETHER = "pass position_ids, seq_lens, and doc_remaining together (packing metadata is all-or-none)"


def _check_packing(present: Iterable[str]) -> None:
    """``ValueError`` unless none or all three packing features are among ``present``."""
    names = set(present)
    given = [name for name in PACKING_FEATURES if name in names]
    if 0 < len(given) < len(PACKING_FEATURES):
        raise ValueError(f"eagle3 packing metadata: {_PACKING_TOGETHER}; got only {given}")


def validate_eagle3_packing_inputs(
    *, position_ids: torch.Tensor | None, seq_lens: torch.Tensor | None, doc_remaining: torch.Tensor | None
) -> None:
    """``ValueError`` unless the three packing inputs are all given or all ``None``."""
    given = {"position_ids": position_ids, "seq_lens": seq_lens, "doc_remaining": doc_remaining}
    _check_packing(name for name, value in given.items() if value is not None)


def _check_encoding(present: set[str]) -> None:
    """``ValueError`` unless ``present`` holds the core features, the packing metadata all-or-none and exactly one
    supervision encoding in full."""
    missing = [name for name in CORE_FEATURES if name not in present]
    if missing:
        raise ValueError(f"eagle3 sample is missing required core features {missing}")
    _check_packing(present)
    has_logits = "logits" in present
    probs = [name for name in PROBS_SUPERVISION if name in present]
    if 0 < len(probs) < len(PROBS_SUPERVISION):
        raise ValueError(
            f"eagle3 sample has a partial draft-vocab encoding {probs}: 'target_probs' and 'position_mask' go together"
        )
    if has_logits and probs:
        raise ValueError(
            "eagle3 sample has both 'logits' and draft-vocab features ('target_probs' + 'position_mask'); "
            "its supervision must be exactly one encoding"
        )
    if not has_logits and not probs:
        raise ValueError(
            "eagle3 sample has no supervision encoding: it needs 'logits' or the pair 'target_probs' + 'position_mask'"
        )


def check_feature_names(names: Iterable[str]) -> None:
    """Raise ``ValueError`` unless ``names`` is a valid EAGLE-3 v1 feature set: the core features, the packing
    metadata all-or-none, exactly one supervision encoding, and no feature outside the schema."""
    present = set(names)
    _check_encoding(present)
    unknown = present - set(FEATURE_ORDER)
    if unknown:
        raise ValueError(f"eagle3 v{SCHEMA_VERSION} has no features {sorted(unknown)} (known: {list(FEATURE_ORDER)})")


def _check_algorithm(ref: SampleRef) -> None:
    if ref.algorithm is not FeatureAlgorithm.EAGLE3:
        raise ValueError(
            f"sample {ref.sample_id!r}: ref.algorithm must be FeatureAlgorithm.EAGLE3 (got {ref.algorithm!r}) "
            "for an EAGLE-3 consumer; route it to a consumer of its algorithm"
        )


def validate_eagle3_ref(ref: SampleRef) -> None:
    """Raise ``ValueError`` naming the sample when ``ref`` is not an EAGLE-3 v1 sample by its names: its algorithm,
    its feature names (the core features, the packing metadata all-or-none, exactly one supervision encoding),
    then its schema version. Further features and each feature's dtype and shape are not checked (``validate_ref``
    checks them too)."""
    _check_algorithm(ref)
    try:
        _check_encoding(set(ref.feature_specs))
    except ValueError as exc:
        raise ValueError(f"sample {ref.sample_id!r}: {exc}") from None
    if ref.schema_version != SCHEMA_VERSION:
        raise ValueError(
            f"sample {ref.sample_id!r}: eagle3 schema_version must be {SCHEMA_VERSION}, got {ref.schema_version}"
        )


def validate_ref(ref: SampleRef) -> None:
    """What the loader checks before materialising a sample: ``validate_eagle3_ref``'s rules and each feature's
    dtype and shape (``check_feature_specs``); ``ValueError`` naming the sample, the feature, what was expected and
    what came. A feature outside the schema (a recipe's own) is passed over, as by ``validate_eagle3_ref``."""
    _check_algorithm(ref)
    EAGLE3_FEATURES.check_ref_features(ref, SCHEMA_VERSION)


def feature_tensors(batch: object) -> dict[str, torch.Tensor]:
    """The schema's tensors of ``batch`` (attributes or a mapping), validated, in ``FEATURE_ORDER``."""
    return EAGLE3_FEATURES.tensors_of(batch)


def produced_tensors(batch: object) -> dict[str, torch.Tensor]:
    """What ``FeatureProducer`` stores of a backend's output: ``feature_tensors(batch)`` whose every dtype and shape
    also passes its EAGLE-3 rule (``check_feature_specs``), else ``ValueError`` naming the feature, what was
    expected and what came (the producer adds the sample and stores nothing)."""
    tensors = feature_tensors(batch)
    check_feature_specs({name: (tuple(tensor.shape), tensor.dtype) for name, tensor in tensors.items()})
    return tensors


def eagle3_logits_tensors(
    *,
    aux_hidden_states: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    logits: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    seq_lens: torch.Tensor | None = None,
    doc_remaining: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The tensors of a logits-supervised sample, keyed in schema order; packing ones only when given (all three)."""
    return feature_tensors(
        {
            "aux_hidden_states": aux_hidden_states,
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "loss_mask": loss_mask,
            "logits": logits,
            "position_ids": position_ids,
            "seq_lens": seq_lens,
            "doc_remaining": doc_remaining,
        }
    )


def eagle3_logits_feature_specs(
    aux_hidden_states: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    logits: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    seq_lens: torch.Tensor | None = None,
    doc_remaining: torch.Tensor | None = None,
) -> dict[str, FeatureSpec]:
    """The ``FeatureSpec`` (exact shape and dtype) of each tensor ``eagle3_logits_tensors`` would return."""
    # Its parameters are eagle3_logits_tensors' own (the reference fixes both signatures): pass them all on by name.
    tensors = eagle3_logits_tensors(**locals())
    return {name: FeatureSpec(tuple(tensor.shape), tensor.dtype) for name, tensor in tensors.items()}


def _check_inputs(inputs: Mapping[str, torch.Tensor | None]) -> None:
    validate_eagle3_packing_inputs(
        position_ids=inputs.get("position_ids"),
        seq_lens=inputs.get("seq_lens"),
        doc_remaining=inputs.get("doc_remaining"),
    )


@dataclasses.dataclass
class Eagle3TargetBatch(FeatureBatch):
    """One materialised EAGLE-3 sample: what the draft trainer steps on.

    The reference's field set and order. Validated on construction
    (``ValueError`` for a broken feature set: names only, see
    ``check_feature_names``); ``to_trainer_inputs()`` gives the trainer's
    forward keywords for the encoding the batch carries: the core features,
    then ``target_logits`` (the ``logits``) or ``target_probs`` +
    ``position_mask``, then the packing metadata when present.
    Features read as attributes or by name (``batch["logits"]``), so code
    written against a plain ``dict`` batch keeps working.
    """

    FEATURES = EAGLE3_FEATURES
    TRAINER_KEYWORDS = MappingProxyType({"logits": "target_logits"})

    aux_hidden_states: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    logits: torch.Tensor | None = None
    target_probs: torch.Tensor | None = None
    position_mask: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None
    doc_remaining: torch.Tensor | None = None


class Eagle3TargetBackend(TargetBackendBase[Eagle3TargetBatch]):
    """A target model that computes EAGLE-3 supervision; ``FeatureProducer`` infers EAGLE-3 from this base.

    ``generate_batch`` (the contract of ``TargetBackendBase``) runs one forward and returns an
    ``Eagle3TargetBatch`` (or any object or mapping with its fields) whose tensors are fresh; the reference's
    recipes also call it with ``(input_ids, attention_mask, loss_mask)`` positionally.
    """

    def set_vocab_mapping(self, selected_token_ids: torch.Tensor, selected_token_mask: torch.Tensor) -> None:
        """Restrict supervision to a draft vocabulary (the target token ids kept, and their mask)."""
        raise NotImplementedError(f"{type(self).__name__} has no draft-vocabulary mapping")


@dataclasses.dataclass(frozen=True, eq=False)
class DraftVocab:
    """A draft vocabulary: which target token ids the draft model predicts (the EAGLE-3 draft-vocab map).

    ``selected_token_ids [D]`` (integer): the target id of each draft id, all
    distinct; ``selected_token_mask [V]`` (bool, ``V`` the target
    vocabulary): ``True`` exactly at those ids. This is the pair an
    ``Eagle3TargetBackend.set_vocab_mapping`` takes; a draft checkpoint's
    ``d2t``/``t2d`` buffers give it through ``from_d2t``. ``TypeError`` /
    ``ValueError`` naming the offending tensor when the two do not describe
    one map. The tensors are copied (``int64``, ``bool``), so later changes
    to the caller's do not reach it.
    """

    selected_token_ids: torch.Tensor
    selected_token_mask: torch.Tensor

    def __post_init__(self) -> None:
        ids, mask = self.selected_token_ids, self.selected_token_mask
        for name, value in (("selected_token_ids", ids), ("selected_token_mask", mask)):
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
            if value.dim() != 1 or value.numel() == 0:
                raise ValueError(f"{name} must be a non-empty 1-D tensor, got shape {tuple(value.shape)}")
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise TypeError(f"selected_token_ids must hold integer token ids, got dtype {ids.dtype}")
        if mask.dtype != torch.bool:
            raise TypeError(f"selected_token_mask must be a bool tensor, got dtype {mask.dtype}")
        ids, mask = ids.detach().to("cpu", torch.int64).clone(), mask.detach().cpu().clone()
        vocab = mask.numel()
        outside = ids[(ids < 0) | (ids >= vocab)]
        if outside.numel():
            raise ValueError(
                f"selected_token_ids {outside[:8].tolist()} lie outside the target vocabulary [0, {vocab}) that "
                "selected_token_mask spans"
            )
        if torch.unique(ids).numel() != ids.numel():
            raise ValueError(
                f"selected_token_ids repeat a token id ({ids.numel()} ids, {torch.unique(ids).numel()} distinct)"
            )
        marked = torch.zeros(vocab, dtype=torch.bool)
        marked[ids] = True
        if not torch.equal(marked, mask):
            differ = torch.nonzero(marked != mask).flatten()[:8].tolist()
            raise ValueError(f"selected_token_mask must be True exactly at selected_token_ids; it differs at {differ}")
        object.__setattr__(self, "selected_token_ids", ids)
        object.__setattr__(self, "selected_token_mask", mask)

    @classmethod
    def from_d2t(cls, d2t: torch.Tensor, t2d: torch.Tensor) -> DraftVocab:
        """The map of an EAGLE-3 draft checkpoint's buffers: ``d2t [D]`` offsets (target id = draft id +
        ``d2t[draft id]``) and ``t2d [V]`` bool (the selected target ids)."""
        if not isinstance(d2t, torch.Tensor):
            raise TypeError(f"d2t must be a torch.Tensor of offsets, got {type(d2t).__name__}")
        # A float d2t stays float here, and the constructor refuses it by name.
        return cls(d2t + torch.arange(d2t.numel(), device=d2t.device), t2d)

    @property
    def size(self) -> int:
        """``D``: the draft vocabulary's size (the last dimension of ``target_probs``)."""
        return self.selected_token_ids.numel()

    @property
    def target_size(self) -> int:
        """``V``: the target vocabulary's size (the last dimension of the ``logits`` it projects)."""
        return self.selected_token_mask.numel()

    def project(self, logits: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(target_probs [B, T, D] float32, position_mask [B, T, 1] bool)`` of ``logits [B, T, V]``.

        ``target_probs`` is the softmax over the draft ids' logits alone;
        ``position_mask`` keeps the positions ``loss_mask`` supervises whose
        target top-1 token is in the draft vocabulary (the draft cannot
        predict the others). The reference's remote target server computes
        the same, to the bit. ``ValueError`` when ``logits`` does not span
        this map's target vocabulary or ``loss_mask`` is not ``[B, T]``.
        """
        if logits.dim() != 3 or logits.shape[-1] != self.target_size:
            raise ValueError(
                f"logits must be [batch, tokens, {self.target_size}] (the draft map's target vocabulary), got "
                f"shape {tuple(logits.shape)}"
            )
        if tuple(loss_mask.shape) != tuple(logits.shape[:2]):
            raise ValueError(
                f"loss_mask must be {tuple(logits.shape[:2])} like logits' positions, got {tuple(loss_mask.shape)}"
            )
        in_draft = self.selected_token_mask.to(logits.device)[logits.argmax(dim=-1)]
        position_mask = (in_draft & loss_mask.bool()).unsqueeze(-1)
        kept = logits.index_select(-1, self.selected_token_ids.to(logits.device))
        return torch.softmax(kept.float(), dim=-1), position_mask


def project_to_draft_vocab(batch: object, vocab: DraftVocab) -> Eagle3TargetBatch:
    """``batch`` (logits-supervised, an object or mapping with the schema's fields) with its ``logits`` replaced by
    their projection onto ``vocab`` (``target_probs`` + ``position_mask``, see ``DraftVocab.project``); every other
    feature is passed on as it is. ``ValueError`` when ``batch`` carries no ``logits``."""
    tensors = feature_tensors(batch)
    logits = tensors.pop("logits", None)
    if logits is None:
        raise ValueError(
            f"project_to_draft_vocab needs a logits-supervised batch, got one with {list(tensors)} (a draft-vocab "
            "encoding is stored as it is)"
        )
    tensors["target_probs"], tensors["position_mask"] = vocab.project(logits, tensors["loss_mask"])
    return Eagle3TargetBatch.from_tensors(tensors)


class DraftVocabTarget(Eagle3TargetBackend):
    """A logits-producing EAGLE-3 target whose batches come out projected onto a draft vocabulary.

    ``generate_batch`` runs ``target.generate_batch`` with the same
    arguments, by keyword, and returns its batch with ``logits [B, T, V]``
    replaced by ``target_probs [B, T, D]`` + ``position_mask [B, T, 1]``
    (``project_to_draft_vocab``), so ``FeatureProducer(DraftVocabTarget(...),
    store, ...)`` stores the draft-vocab encoding the reference's remote
    target server ships, never the full-vocabulary logits. The map is
    ``vocab`` or the last ``set_vocab_mapping(selected_token_ids,
    selected_token_mask)`` (what ``FeatureProducer.set_vocab_mapping``
    forwards); ``generate_batch`` before either raises ``RuntimeError``.
    ``target`` is any backend with ``generate_batch`` returning logits (this
    package's, the reference's ``HFEagle3TargetModel``). Thread-safe: a map
    set while a forward runs applies from the next batch.
    """

    def __init__(self, target: object, vocab: DraftVocab | None = None) -> None:
        if not callable(getattr(target, "generate_batch", None)):
            raise TypeError(f"target must have a generate_batch(...) method, got {type(target).__name__}")
        if vocab is not None and not isinstance(vocab, DraftVocab):
            raise TypeError(f"vocab must be a DraftVocab or None, got {type(vocab).__name__}")
        self.target = target
        self._vocab = vocab
        self._lock = threading.Lock()

    @property
    def vocab(self) -> DraftVocab | None:
        """The draft-vocab map batches are projected with (``None`` until one is given)."""
        with self._lock:
            return self._vocab

    def set_vocab_mapping(self, selected_token_ids: torch.Tensor, selected_token_mask: torch.Tensor) -> None:
        """Project later batches onto this map (checked as ``DraftVocab`` checks it; a refused map changes
        nothing)."""
        vocab = DraftVocab(selected_token_ids, selected_token_mask)
        with self._lock:
            self._vocab = vocab

    def get_input_embeddings(self) -> torch.nn.Module:
        """The wrapped target's input embeddings."""
        return self.target.get_input_embeddings()  # type: ignore[attr-defined,no-any-return]

    def target_batch(self, inputs: TargetInputs) -> Eagle3TargetBatch:
        """The wrapped target's batch for these inputs, its logits projected onto the draft vocabulary."""
        vocab = self.vocab
        if vocab is None:
            raise RuntimeError(
                f"DraftVocabTarget over {type(self.target).__name__} has no draft-vocab map: pass vocab= or call "
                "set_vocab_mapping(selected_token_ids, selected_token_mask) first"
            )
        # Packing keywords only when given: a wrapped target that takes none (the reference's remote client) works.
        packing = {
            "position_ids": inputs.position_ids,
            "seq_lens": inputs.seq_lens,
            "doc_remaining": inputs.doc_remaining,
        }
        given = {name: value for name, value in packing.items() if value is not None}
        with torch.no_grad():
            batch = self.target.generate_batch(  # type: ignore[attr-defined]
                input_ids=inputs.input_ids, attention_mask=inputs.attention_mask, loss_mask=inputs.loss_mask, **given
            )
            return project_to_draft_vocab(batch, vocab)


class Eagle3ForwardBackend(Eagle3TargetBackend):
    """An ``Eagle3TargetBackend`` defined by one forward: subclasses implement ``forward_features``.

    ``generate_batch`` runs ``forward_features`` on its inputs (a
    ``TargetInputs``, read as the ``ForwardInputs`` it extends) under
    ``torch.no_grad()`` and returns an ``Eagle3TargetBatch`` in the EAGLE-3
    token alignment (module docstring): ``logits``, ``input_ids`` and
    ``loss_mask`` shifted left, the ``aux_hidden_states``,
    ``attention_mask`` and packing metadata as they are.
    """

    def target_batch(self, inputs: TargetInputs) -> Eagle3TargetBatch:
        """One no-grad forward over the batch: EAGLE-3 supervision with logits, in the EAGLE-3 token alignment."""
        with torch.no_grad():
            aux_hidden_states, logits = self.forward_features(inputs)
        return inputs.batch(
            Eagle3TargetBatch,
            aux_hidden_states=aux_hidden_states,
            input_ids=shift_left(inputs.input_ids),
            loss_mask=shift_left(inputs.loss_mask),
            logits=shift_left(logits),
        )

    @abc.abstractmethod
    def forward_features(self, inputs: ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """``(aux_hidden_states [B, T, 3H], logits [B, T, V])`` for ``inputs.input_ids [B, T]``, as fresh tensors in
        the input's positions (not shifted); with ``inputs.seq_lens`` (packing) each document attends to itself
        only."""


EAGLE3_SCHEMA = register(
    AlgorithmSchema(
        algorithm=FeatureAlgorithm.EAGLE3,
        schema_version=EAGLE3_SCHEMA_VERSION,
        required_features=EAGLE3_CORE_FEATURES,
        optional_features=LOGITS_SUPERVISION + PROBS_SUPERVISION + PACKING_FEATURES,
        validate_ref=validate_ref,
        feature_tensors=feature_tensors,
        produced_tensors=produced_tensors,
        check_inputs=_check_inputs,
        batch_type=Eagle3TargetBatch,
        backend_type=Eagle3TargetBackend,
        reference_backend_type="nemo_automodel.components.speculative.eagle.backend.Eagle3TargetBackend",
        reference_batch_type="nemo_automodel.components.speculative.eagle.target.Eagle3TargetBatch",
    )
)
