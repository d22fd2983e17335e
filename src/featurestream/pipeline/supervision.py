"""The hidden-state encoding of a sample's supervision: the target's last hidden state stored, its logits rebuilt
where the trainer runs.

A backend that returns a ``HiddenSupervised`` (the Hugging Face wrappers
with ``supervision="hidden"``, or a user's own) has its sample stored with
the hidden-state feature of ``HIDDEN_SUPERVISION`` in place of the logits
feature (EAGLE-3, DFlash: ``last_hidden_states``; EAGLE-1/2: its
``target_hidden_states``, no ``target_logits``), and its ref says so:
``provenance = {"supervision": "hidden", "target_head": <the head's
fingerprint>}``. The producer checks the sample as the logits encoding's
sample it stands for (the logits' shape ``[..., V]`` and dtype are the
head's), so the schema's rules hold for both.

On the consumer's side ``SupervisionDecoder`` (what ``FeatureDataLoader``
runs with its ``target_head``) refuses a hidden-encoded sample without a
head or with another head than the producer's, checks its ref as the logits
encoding's, and rebuilds the logits (or, with a ``DraftVocab``, their
projection ``target_probs`` + ``position_mask``), so a trainer receives the
batch it would have received from a logits-encoded sample.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from featurestream.common.refs import (
    HIDDEN,
    HIDDEN_SUPERVISION,
    SUPERVISION_KEY,
    TARGET_HEAD_KEY,
    FeatureAlgorithm,
    FeatureSpec,
    SampleRef,
    algorithm_name,
)
from featurestream.pipeline import fp8
from featurestream.pipeline.eagle3 import PROBS_SUPERVISION, DraftVocab
from featurestream.pipeline.features import TargetInputs
from featurestream.pipeline.schemas import AlgorithmSchema
from featurestream.pipeline.target_head import TargetHead

__all__ = ["HiddenSupervised", "SupervisionDecoder", "hidden_supervised", "stored_tensors"]


@dataclasses.dataclass(frozen=True)
class HiddenSupervised:
    """A backend's batch whose supervision is left to the trainer's side.

    ``features``: the algorithm's features without its logits feature and
    with its hidden-state feature (``HIDDEN_SUPERVISION``: the target's
    last hidden state in the logits' alignment), by name; ``head``: the
    target's LM head, which rebuilds the logits from that state.
    """

    features: Mapping[str, torch.Tensor | None]
    head: TargetHead


def hidden_supervised(inputs: TargetInputs, head: TargetHead, **features: torch.Tensor) -> HiddenSupervised:
    """A ``HiddenSupervised`` of ``features`` and every input of ``inputs`` they do not replace, passed through."""
    passed = {field.name: getattr(inputs, field.name) for field in dataclasses.fields(inputs)}
    return HiddenSupervised({**passed, **features}, head)


def _encoding(schema: AlgorithmSchema) -> tuple[str, str, bool]:
    """``(logits feature, hidden feature, whether the hidden feature is one of its own)`` of ``schema``'s
    algorithm; ``ValueError`` for an algorithm without the hidden-state encoding."""
    algorithm = schema.algorithm
    names = HIDDEN_SUPERVISION.get(algorithm) if isinstance(algorithm, FeatureAlgorithm) else None
    if names is None:
        raise ValueError(
            f"{algorithm_name(algorithm)} has no hidden-state supervision encoding (it exists for "
            f"{[a.value for a in HIDDEN_SUPERVISION]})"
        )
    logits, hidden = names
    return logits, hidden, hidden not in schema.feature_order


def stored_tensors(schema: AlgorithmSchema, batch: object) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """What a producer stores of a backend's ``batch`` and the ref's provenance for it.

    A ``HiddenSupervised`` batch is checked as the logits-encoded sample it
    stands for and stored with its hidden state instead of the logits
    (provenance: the encoding and the head's fingerprint); any other batch
    is ``schema.produced_tensors(batch)``, with no provenance. ``ValueError``
    naming the feature when the batch breaks the schema's rules, carries
    the logits too, or its hidden state is not what the head takes.
    """
    if not isinstance(batch, HiddenSupervised):
        return schema.produced_tensors(batch), {}
    logits_name, hidden_name, own = _encoding(schema)
    features = {name: tensor for name, tensor in batch.features.items() if tensor is not None}
    hidden, head = features.get(hidden_name), batch.head
    if not isinstance(hidden, torch.Tensor) or logits_name in features:
        raise ValueError(
            f"a hidden-state-supervised {algorithm_name(schema.algorithm)} batch carries the tensor {hidden_name!r} "
            f"and no {logits_name!r}, got features {sorted(features)}"
        )
    if hidden.shape[-1:] != (head.hidden_size,) or hidden.dtype != head.dtype:
        raise ValueError(
            f"feature {hidden_name!r} is {list(hidden.shape)} {hidden.dtype}, but the target head {head!r} takes "
            f"[..., {head.hidden_size}] {head.dtype}"
        )
    # The logits the sample stands for, as a shape and dtype only: the schema checks them like computed ones.
    standing = torch.empty((*hidden.shape[:-1], head.vocab_size), dtype=head.dtype, device="meta")
    decoded = {name: tensor for name, tensor in features.items() if not (own and name == hidden_name)}
    checked = schema.produced_tensors({**decoded, logits_name: standing})
    stored: dict[str, torch.Tensor] = {}
    for name, tensor in checked.items():
        if name != logits_name:
            stored[name] = tensor
        elif own:
            stored[hidden_name] = hidden
    return stored, {SUPERVISION_KEY: HIDDEN, TARGET_HEAD_KEY: head.fingerprint}


class SupervisionDecoder:
    """The consumer's side: checks a ref's encoding against the head it has, and rebuilds the logits.

    ``head``: the target's LM head (``None``: hidden-encoded samples are
    refused); ``draft_vocab``: rebuild ``target_probs`` + ``position_mask``
    (``DraftVocab.project``) instead of EAGLE-3's ``logits``; ``device``:
    where the head is moved to (by default it stays where it is). Stateless
    past construction, so one decoder serves every thread.
    """

    def __init__(
        self,
        schema: AlgorithmSchema,
        head: TargetHead | None = None,
        draft_vocab: DraftVocab | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        if head is not None and not isinstance(head, TargetHead):
            raise TypeError(f"target_head must be a featurestream.TargetHead or None, got {type(head).__name__}")
        if head is not None and device is not None:
            head = head.to(device)
        if draft_vocab is not None:
            if not isinstance(draft_vocab, DraftVocab):
                raise TypeError(f"draft_vocab must be a DraftVocab or None, got {type(draft_vocab).__name__}")
            if head is None or schema.algorithm is not FeatureAlgorithm.EAGLE3:
                raise ValueError("draft_vocab= projects rebuilt EAGLE-3 logits: it needs target_head= and EAGLE-3")
            if draft_vocab.target_size != head.vocab_size:
                raise ValueError(
                    f"draft_vocab maps a target vocabulary of {draft_vocab.target_size}, but the target head "
                    f"{head!r} has {head.vocab_size} rows"
                )
        self._schema = schema
        self.head = head
        self.draft_vocab = draft_vocab

    def check(self, ref: SampleRef) -> SampleRef:
        """The ref the schema checks: ``ref`` itself for the reference's encodings, else the ref of the sample it
        stands for (8-bit features in their producer's dtype, the logits for the target's last hidden state).
        ``ValueError`` naming the sample and the head(s) when this decoder has no head, or one whose fingerprint
        differs from the producer's."""
        provenance = ref.provenance or {}
        if not provenance:
            return ref
        specs = fp8.stored_specs(ref)
        if provenance.get(SUPERVISION_KEY) == HIDDEN:
            self._check_head(ref)
            assert self.head is not None
            logits_name, hidden_name, own = _encoding(self._schema)
            hidden = specs[hidden_name]
            if own:
                del specs[hidden_name]
            specs[logits_name] = FeatureSpec((*hidden.shape[:-1], self.head.vocab_size), self.head.dtype)
        keys = {name: ref.feature_keys.get(name, name) for name in specs}
        return dataclasses.replace(ref, feature_keys=keys, feature_specs=specs, provenance=None)

    def _check_head(self, ref: SampleRef) -> None:
        logits_name, hidden_name, _ = _encoding(self._schema)
        produced_with = (ref.provenance or {})[TARGET_HEAD_KEY]
        head = self.head
        if head is None:
            raise ValueError(
                f"sample {ref.sample_id!r} carries the target's last hidden state ({hidden_name!r}) instead of "
                f"{logits_name!r} (produced with the target head {produced_with}); pass "
                "target_head=featurestream.TargetHead.from_pretrained(<the target's checkpoint>) (or .from_model) "
                "to FeatureDataLoader to rebuild them"
            )
        if head.fingerprint != produced_with:
            raise ValueError(
                f"sample {ref.sample_id!r} was produced with the target head {produced_with}, but this loader's "
                f"target_head is {head.fingerprint} ({head.source}): another model, vocabulary or dtype; pass the "
                "head of the target that produced it"
            )

    def decode(self, ref: SampleRef, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``tensors`` of ``ref`` as the trainer takes them: 8-bit features dequantised; for a hidden-encoded sample,
        the logits (or their draft-vocab projection) rebuilt on the head's device in the logits' place, in the
        schema's order."""
        provenance = ref.provenance or {}
        if not provenance:
            return tensors
        tensors = fp8.dequantize(ref, tensors)
        if provenance.get(SUPERVISION_KEY) != HIDDEN or self.head is None:
            return tensors
        logits_name, hidden_name, own = _encoding(self._schema)
        rebuilt = {logits_name: self.head.logits(tensors[hidden_name])}
        if self.draft_vocab is not None:
            probs, mask = self.draft_vocab.project(rebuilt.pop(logits_name), tensors["loss_mask"])
            rebuilt = dict(zip(PROBS_SUPERVISION, (probs, mask), strict=True))
        kept = {name: tensor for name, tensor in tensors.items() if not (own and name == hidden_name)}
        merged = {**kept, **rebuilt}
        return {name: merged[name] for name in self._schema.feature_order if name in merged}
