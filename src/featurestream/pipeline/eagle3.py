"""The EAGLE-3 feature schema (version 1) and the batch a draft trainer consumes.

A sample carries the core features ``aux_hidden_states`` (the target's
low/mid/high-layer hidden states, concatenated), ``input_ids``,
``attention_mask`` and ``loss_mask``; its supervision is exactly one of
``logits`` or the pair ``target_probs`` + ``position_mask``; the packing
metadata ``position_ids``, ``seq_lens``, ``doc_remaining`` is all-or-none.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable, Iterator, Mapping

import torch

from featurestream.core.refs import FeatureAlgorithm, SampleRef

__all__ = [
    "CORE_FEATURES",
    "Eagle3TargetBackend",
    "FEATURE_ORDER",
    "LOGITS_SUPERVISION",
    "PACKING_FEATURES",
    "PROBS_SUPERVISION",
    "SCHEMA_VERSION",
    "Eagle3TargetBatch",
    "check_feature_names",
    "feature_tensors",
    "validate_ref",
]

SCHEMA_VERSION = 1
CORE_FEATURES = ("aux_hidden_states", "input_ids", "attention_mask", "loss_mask")
LOGITS_SUPERVISION = ("logits",)
PROBS_SUPERVISION = ("target_probs", "position_mask")
PACKING_FEATURES = ("position_ids", "seq_lens", "doc_remaining")
FEATURE_ORDER = CORE_FEATURES + LOGITS_SUPERVISION + PROBS_SUPERVISION + PACKING_FEATURES


def require_eagle3(algorithm: FeatureAlgorithm | str | None, owner: str) -> FeatureAlgorithm:
    """``algorithm`` as a ``FeatureAlgorithm`` (``None`` means EAGLE-3); ``ValueError`` for any other."""
    resolved = FeatureAlgorithm.EAGLE3 if algorithm is None else FeatureAlgorithm(algorithm)
    if resolved is not FeatureAlgorithm.EAGLE3:
        raise ValueError(f"{owner} implements the eagle3 schema only, got algorithm {resolved.value!r}")
    return resolved


def check_feature_names(names: Iterable[str]) -> None:
    """Raise ``ValueError`` unless ``names`` is a valid EAGLE-3 v1 feature set."""
    present = set(names)
    unknown = present - set(FEATURE_ORDER)
    if unknown:
        raise ValueError(f"eagle3 v{SCHEMA_VERSION} has no features {sorted(unknown)}")
    missing = [name for name in CORE_FEATURES if name not in present]
    if missing:
        raise ValueError(f"eagle3 sample is missing core features {missing}")
    has_logits = "logits" in present
    probs = [name for name in PROBS_SUPERVISION if name in present]
    if has_logits == bool(probs) or 0 < len(probs) < len(PROBS_SUPERVISION):
        raise ValueError(
            "eagle3 supervision must be exactly one of 'logits' or the pair 'target_probs' + 'position_mask', "
            f"got {sorted(present & {'logits', *PROBS_SUPERVISION})}"
        )
    packing = [name for name in PACKING_FEATURES if name in present]
    if 0 < len(packing) < len(PACKING_FEATURES):
        raise ValueError(f"eagle3 packing metadata {list(PACKING_FEATURES)} is all-or-none, got only {packing}")


def validate_ref(ref: SampleRef) -> None:
    """Raise ``ValueError`` when ``ref`` is not an EAGLE-3 v1 sample (checked before materialising)."""
    if ref.algorithm is not FeatureAlgorithm.EAGLE3:
        raise ValueError(f"sample {ref.sample_id!r} is {ref.algorithm.value}, not eagle3")
    if ref.schema_version != SCHEMA_VERSION:
        raise ValueError(
            f"sample {ref.sample_id!r} has eagle3 schema version {ref.schema_version}, expected {SCHEMA_VERSION}"
        )
    try:
        check_feature_names(ref.feature_names())
    except ValueError as exc:
        raise ValueError(f"sample {ref.sample_id!r}: {exc}") from None


def feature_tensors(batch: object) -> dict[str, torch.Tensor]:
    """The schema's tensors of ``batch`` (attributes or a mapping), validated, in ``FEATURE_ORDER``."""
    if isinstance(batch, Mapping):
        found = {name: batch.get(name) for name in FEATURE_ORDER}
    else:
        found = {name: getattr(batch, name, None) for name in FEATURE_ORDER}
    tensors = {name: value for name, value in found.items() if value is not None}
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"eagle3 feature {name!r} must be a torch.Tensor, got {type(value).__name__}")
    check_feature_names(tensors)
    return tensors


@dataclasses.dataclass
class Eagle3TargetBatch:
    """One materialised EAGLE-3 sample: what the draft trainer steps on.

    Validated on construction (``ValueError`` for a broken feature set).
    Features read as attributes or by name (``batch["logits"]``), so code
    written against a plain ``dict`` batch keeps working.
    """

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

    def __post_init__(self) -> None:
        feature_tensors(self)

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, torch.Tensor]) -> Eagle3TargetBatch:
        """Build a batch from name -> tensor; ``ValueError`` for names outside the schema."""
        check_feature_names(tensors)
        return cls(**tensors)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The features present, in schema order."""
        return feature_tensors(self)

    def __getitem__(self, name: str) -> torch.Tensor:
        value = getattr(self, name, None) if name in FEATURE_ORDER else None
        if value is None:
            raise KeyError(name)
        return value

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in FEATURE_ORDER and getattr(self, name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors())

    def keys(self) -> list[str]:
        return list(self.tensors())


class Eagle3TargetBackend(abc.ABC):
    """A target model that computes EAGLE-3 supervision; ``FeatureProducer`` infers EAGLE-3 from this base.

    ``generate_batch`` runs one forward and returns an ``Eagle3TargetBatch``
    (or any object or mapping with its fields) whose tensors are fresh.
    """

    @abc.abstractmethod
    def generate_batch(
        self,
        *,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        loss_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
        doc_remaining: torch.Tensor | None = None,
    ) -> object:
        """One no-grad forward over the batch; packing metadata is passed through."""

    def get_input_embeddings(self) -> torch.nn.Module:
        """The target's input embedding (a draft head may share it)."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its input embeddings")

    def set_vocab_mapping(self, selected_token_ids: torch.Tensor, selected_token_mask: torch.Tensor) -> None:
        """Restrict supervision to a draft vocabulary (the target token ids kept, and their mask)."""
        raise NotImplementedError(f"{type(self).__name__} has no draft-vocabulary mapping")
