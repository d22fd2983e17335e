"""``NoStore``: the store of an operator's handle on a queue, which neither puts nor leases."""

from __future__ import annotations

from typing import Any

from featurestream.stores.base import FeatureStore, StoreHealth

__all__ = ["NoStore"]


class NoStore(FeatureStore):
    """The store of an operator's handle on queue ``queue`` (made by ``opened_by``): nothing to retain or read, so
    every producing or consuming call fails; health and gc are empty."""

    store_uri = "none://operator-handle"

    def __init__(self, queue: str, opened_by: str) -> None:
        self.queue = queue
        self.opened_by = opened_by

    def _refuse(self, *_: object, **__: object) -> Any:
        raise RuntimeError(f"this is an operator's handle ({self.opened_by}): it has no feature store")

    put = get = release = retain = unretain = scrub = _refuse  # type: ignore[assignment]

    def gc(self) -> int:
        return 0

    def health(self) -> StoreHealth:
        return StoreHealth(0, 0, 0, False, True)

    def close(self) -> None:
        pass
