"""The constructor and ``put`` argument checks both queue backends share (one wording for every bad value)."""

from __future__ import annotations

from featurestream.common.checks import check_count, check_seconds
from featurestream.common.refs import SampleRef, check_tensor_free
from featurestream.core.lease import VisibilityTimeout
from featurestream.stores.base import FeatureStore

__all__ = ["check_queue_arguments", "check_ref_for"]


def check_queue_arguments(
    store: object,
    visibility_timeout: object,
    high_watermark_bytes: object,
    low_watermark_bytes: object,
    *,
    max_deliveries: object,
    dedup_window: object,
    keep_dead_letter_bytes: object,
    reaper_interval: object,
) -> None:
    """Raise ``TypeError`` / ``ValueError`` naming the first bad argument a lease queue's constructor got.

    ``store`` a ``FeatureStore``; ``visibility_timeout`` ``None`` or a ``VisibilityTimeout``; the watermarks
    ``None`` or counts, the high one positive, ``low < high`` when both are set (a non-empty hysteresis band);
    ``max_deliveries`` >= 1; ``dedup_window`` and ``keep_dead_letter_bytes`` >= 0; ``reaper_interval`` ``None``
    or > 0 seconds.
    """
    if not isinstance(store, FeatureStore):
        raise TypeError(f"store must be a FeatureStore, got {type(store).__name__}")
    if visibility_timeout is not None and not isinstance(visibility_timeout, VisibilityTimeout):
        raise TypeError(f"visibility_timeout must be a VisibilityTimeout, got {visibility_timeout!r}")
    # The reference's phrases for out-of-range watermarks; check_count words the wrong types.
    if type(high_watermark_bytes) is int and high_watermark_bytes < 1:
        raise ValueError(f"high_watermark_bytes must be positive, got {high_watermark_bytes!r}")
    if type(low_watermark_bytes) is int and low_watermark_bytes < 0:
        raise ValueError(f"low_watermark_bytes must be non-negative, got {low_watermark_bytes!r}")
    check_count("high_watermark_bytes", high_watermark_bytes, allow_none=True)
    check_count("low_watermark_bytes", low_watermark_bytes, allow_none=True)
    if high_watermark_bytes is not None and low_watermark_bytes is not None:
        assert isinstance(low_watermark_bytes, int) and isinstance(high_watermark_bytes, int)  # checked above
        if low_watermark_bytes >= high_watermark_bytes:
            raise ValueError(
                f"low_watermark_bytes ({low_watermark_bytes}) must be strictly less than "
                f"high_watermark_bytes ({high_watermark_bytes}) so the hysteresis band is non-empty"
            )
    check_count("max_deliveries", max_deliveries, minimum=1)
    check_count("dedup_window", dedup_window)
    check_count("keep_dead_letter_bytes", keep_dead_letter_bytes)
    if reaper_interval is not None:
        check_seconds("reaper_interval", reaper_interval, positive=True)


def check_ref_for(store: FeatureStore, ref: object) -> None:
    """``TypeError`` unless ``ref`` is a ``SampleRef`` holding no tensor anywhere (a subclass's extra attributes
    included); ``ValueError`` when it lives in a store other than ``store`` (compared by ``store_uri``; a store
    without one accepts any ref)."""
    if not isinstance(ref, SampleRef):
        raise TypeError(f"put expects a SampleRef, got {type(ref).__name__}: {ref!r:.80}")
    check_tensor_free(ref)
    store_uri = getattr(store, "store_uri", ref.store_uri)
    if ref.store_uri != store_uri:
        raise ValueError(
            f"sample {ref.sample_id!r} lives in {ref.store_uri}, but this queue's store is {store_uri}; "
            "put it into the queue bound to that store"
        )
