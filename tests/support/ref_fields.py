"""The keywords of a valid EAGLE-3 ``SampleRef``, for the tests that build refs by hand (core and compat)."""

from __future__ import annotations

from collections.abc import Mapping

from featurestream import FeatureAlgorithm, FeatureSpec


def ref_fields(specs: Mapping[str, FeatureSpec], **overrides: object) -> dict[str, object]:
    """``SampleRef(**ref_fields(specs))`` is sample ``s0`` of run ``run`` holding ``specs``.

    ``overrides`` replace fields. The caller constructs the ref itself, so a compat test does it through
    the reference's import path.
    """
    fields: dict[str, object] = dict(
        sample_id="s0",
        run_id="run",
        store_uri="mem://x",
        feature_keys={name: f"s0/{name}" for name in specs},
        feature_specs=dict(specs),
        algorithm=FeatureAlgorithm.EAGLE3,
        schema_version=1,
        num_tokens=4,
        estimated_bytes=sum(spec.nbytes for spec in specs.values()),
        target_model_version="0",
        draft_weight_version="0",
    )
    fields.update(overrides)
    return fields
