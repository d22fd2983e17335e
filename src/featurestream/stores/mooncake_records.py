"""Each Mooncake writer's residency record: the keys and sizes of the samples it wrote, published in a slot.

Every writer of a namespace claims a slot ``<namespace>/.residency/<n>`` on its
first ``put`` and republishes its record after every ``put`` and on a beat, so
every instance can count the run's residency (``health``) and tell a dead
writer's record from a live one's (``reclaim_orphans``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from featurestream.stores.ledger import LedgerFeatureStore
from featurestream.stores.mooncake_client import code
from featurestream.stores.orphans import OrphanClock

__all__ = ["ResidencyRecords"]

logger = logging.getLogger("featurestream.stores.mooncake")


class ResidencyRecords(LedgerFeatureStore):
    """The record half of ``MooncakeFeatureStore``: what it publishes of itself and reads of the other writers."""

    _client: Any
    _config: Any
    _client_lock: threading.Lock
    _client_closed: bool
    _publish_lock: threading.Lock
    _keys: dict[str, str]
    _writer: str
    _slot: str | None
    _slots: list[str]
    _orphans: OrphanClock

    def _record(self) -> bytes:
        with self._lock:
            samples = {key: self._resident[sid].nbytes for sid, key in self._keys.items() if sid in self._resident}
        # ``beat``/``every``: when it was published (wall clock: writers on other machines read it) and how often it
        # is, so a reader tells a dead writer's record (no beat for ``every`` plus its grace) from a live one's.
        record = {"writer": self._writer, "samples": samples, "beat": time.time(), "every": self._orphans.interval}
        return json.dumps(record, separators=(",", ":")).encode()

    def _publish(self) -> None:
        """Upload this instance's residency record to its slot (claiming one first); a failure is logged.

        Only an under-count elsewhere can follow from a failed upload, never a failed put: the next put uploads
        the record again (and ``health`` does when the slot it had vanished).
        """
        with self._publish_lock:
            record = self._record()
            with self._client_lock:
                if self._client_closed:
                    return
                if self._slot is not None:
                    rc = int(self._client.upsert(self._slot, record, self._config))
                else:
                    rc = self._claim(record)
            if rc != 0:
                logger.warning(
                    "%s: could not publish this writer's residency record (%s); other processes' health() "
                    "does not count its samples until it can",
                    self.store_uri,
                    code(rc) if rc < 0 else "every one of the namespace's residency slots is taken",
                )

    def _claim(self, record: bytes) -> int:
        """Take the first free residency slot: a ``put`` never replaces an existing object, so whoever's record
        reads back from a slot owns it. 0 once claimed; else a Mooncake error code, or 1 when none is free."""
        found = self._client.batch_is_exist(self._slots)
        free = [slot for slot, exists in zip(self._slots, found, strict=True) if int(exists) == 0]
        failed = 1
        for slot in free:
            rc = int(self._client.put(slot, record, self._config))
            if rc != 0:  # taken meanwhile (a put in flight may answer so), or the master refused: try the next
                failed = rc
                continue
            if self._writer_of(self._client.get(slot)) == self._writer:
                self._slot = slot
                return 0
        return failed

    @staticmethod
    def _parse(blob: bytes) -> tuple[str, dict[str, int]] | None:
        try:
            record = json.loads(blob)
            writer, samples = record["writer"], record["samples"]
            if isinstance(writer, str) and isinstance(samples, dict):
                return writer, {str(key): int(nbytes) for key, nbytes in samples.items()}
        except (ValueError, KeyError, TypeError):
            pass
        return None

    def _writer_of(self, blob: bytes) -> str | None:
        parsed = self._parse(blob)
        return parsed[0] if parsed is not None else None

    def _others_samples(self, slot_exists: list[bool]) -> dict[str, int]:
        """Object key -> bytes of the samples the namespace's other writers wrote that Mooncake still holds.

        ``slot_exists``: which residency slots exist (``_reconcile(self._slots)``). Two more master calls when
        other writers hold a slot: their records, and which of the records' objects exist. Also republishes
        this instance's own record when its slot vanished (the segment holding it went away).
        """
        taken = [slot for slot, exists in zip(self._slots, slot_exists, strict=True) if exists]
        mine = self._slot
        if mine is not None and mine not in taken:
            with self._publish_lock:
                if self._slot == mine:
                    self._slot = None
            self._publish()
        others = [slot for slot in taken if slot != mine]
        if not others:
            return {}
        with self._client_lock:
            if self._client_closed:
                return {}
            blobs = self._client.get_batch(others)
        samples: dict[str, int] = {}
        for blob in blobs:
            parsed = self._parse(blob) if blob else None  # empty: removed since, or being written
            if parsed is not None and parsed[0] != self._writer:
                samples.update(parsed[1])
        if not samples:
            return {}
        keys = list(samples)
        with self._client_lock:
            if self._client_closed:
                return {}
            held = self._client.batch_is_exist(keys)
        return {key: samples[key] for key, found in zip(keys, held, strict=True) if int(found) == 1}
