"""The training ledger of a Redis queue: the same state as ``MemoryLedger``, as keys in the queue's namespace.

Every change is one Lua script (atomic on the server) and durable as the
queue is (run Redis with ``--appendonly yes --appendfsync always``); on a
replicated queue (``min_replicas``) a change returns only once it reached
that many replicas, as the queue's own calls do (``docs/redis.md``). Keys,
under the queue's prefix (its hash tag, so a cluster keeps them together):
``resume:gen`` (prompt key -> generation), ``resume:owner`` (prompt key ->
the claim that set its generation, so a retried claim is recognised),
``resume:trained`` (prompt key -> ``rank:step``), ``resume:steps:<rank>``
(a sorted set of the rank's trained keys by step), ``resume:ranks``
(``inc:<rank>`` -> incarnation), ``resume:restores`` (a restore's token -> its reply, so a retried restore
reports the keys its first run rolled back) and ``resume:counts`` (restores, duplicates; not ``meta``,
which names a queue to ``list_queues``).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import redis

from featurestream.backends.redis.link import reply_text
from featurestream.core.resume import (
    LedgerProgress,
    Restore,
    StaleTrainer,
    TrainingLedger,
    check_key,
    check_rank_step,
)

__all__ = ["RedisTrainingLedger"]

# Arguments per script call: far below Lua's unpack limit, and a call stays short on the server.
_CHUNK = 512

_DECLARE = """
local added = 0
for i = 1, #ARGV do
  added = added + redis.call('HSETNX', KEYS[1], ARGV[i], 0)
end
return added
"""

# A key is claimed when it is untrained and still at the expected generation; a retry of the same claim (same
# token) after a lost reply finds its own claim and reports it again.
_CLAIM = """
local out = {}
for i = 2, #ARGV, 2 do
  local key, expected = ARGV[i], tonumber(ARGV[i + 1])
  if redis.call('HEXISTS', KEYS[2], key) == 0 then
    local current = tonumber(redis.call('HGET', KEYS[1], key))
    if current == expected then
      redis.call('HSET', KEYS[1], key, expected + 1)
      redis.call('HSET', KEYS[3], key, ARGV[1])
      out[#out + 1] = key
    elseif current == expected + 1 and redis.call('HGET', KEYS[3], key) == ARGV[1] then
      out[#out + 1] = key
    end
  end
end
return out
"""

_ADMIT = """
local out = {}
for i = 1, #ARGV, 2 do
  local current = redis.call('HGET', KEYS[1], ARGV[i])
  if not current then
    out[#out + 1] = 1
  elseif redis.call('HEXISTS', KEYS[2], ARGV[i]) == 0 and current == ARGV[i + 1] then
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
"""

# A retry of the same restore (same token) after a lost or unreplicated reply reports its first run: rolling
# back again would find nothing later and lose the list of keys to train again.
_RESTORE = """
local done = redis.call('HGET', KEYS[5], ARGV[3])
if done then
  return cjson.decode(done)
end
local incarnation = redis.call('HINCRBY', KEYS[1], 'inc:' .. ARGV[1], 1)
local later = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. ARGV[2], '+inf')
for i = 1, #later, 512 do
  redis.call('HDEL', KEYS[3], unpack(later, i, math.min(i + 511, #later)))
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '(' .. ARGV[2], '+inf')
redis.call('HINCRBY', KEYS[4], 'restores', 1)
local reply = {incarnation, later}
redis.call('HSET', KEYS[5], ARGV[3], cjson.encode(reply))
return reply
"""

# A key already trained by this very step (a retried commit) is no duplicate.
_COMMIT = """
local latest = redis.call('HGET', KEYS[1], 'inc:' .. ARGV[1])
if latest ~= ARGV[2] then
  return {0, latest or ''}
end
local mark = ARGV[1] .. ':' .. ARGV[3]
local duplicates = 0
for i = 4, #ARGV do
  local key = ARGV[i]
  if redis.call('HEXISTS', KEYS[4], key) == 1 then
    if redis.call('HSETNX', KEYS[3], key, mark) == 1 then
      redis.call('ZADD', KEYS[2], ARGV[3], key)
    elseif redis.call('HGET', KEYS[3], key) ~= mark then
      duplicates = duplicates + 1
    end
  end
end
if duplicates > 0 then
  redis.call('HINCRBY', KEYS[5], 'duplicates', duplicates)
end
return {1, duplicates}
"""


def _chunks(items: Sequence[Any], size: int = _CHUNK) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class RedisTrainingLedger(TrainingLedger):
    """``TrainingLedger`` in Redis under ``prefix``; ``RedisSampleRefQueue.training_ledger()`` makes it.

    ``retrying(fn, *args)`` is the queue's retry of connection errors; every
    script is idempotent under it. ``holds`` reads which sample ids the queue
    holds (its ``refs`` hash) and raises when Redis cannot tell.
    ``replicated`` (the queue link's, ``Link.replicated``) runs each change on a
    pipeline it hands over and returns once the change reached the queue's
    ``min_replicas`` (retrying it, idempotent, when it fell short).
    """

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        retrying: Callable[..., Any],
        holds: Callable[[Sequence[str]], set[str]],
        replicated: Callable[[Callable[[Any], object]], Any] | None = None,
    ) -> None:
        self._retrying = retrying
        self._replicated = replicated
        self._holds = holds
        base = prefix + "resume:"
        self._gen, self._owner, self._trained = base + "gen", base + "owner", base + "trained"
        self._ranks, self._counts, self._steps_base = base + "ranks", base + "counts", base + "steps:"
        self._restores = base + "restores"
        self._redis = client
        self._declare = client.register_script(_DECLARE)
        self._claim = client.register_script(_CLAIM)
        self._admit = client.register_script(_ADMIT)
        self._restore = client.register_script(_RESTORE)
        self._commit = client.register_script(_COMMIT)

    def _steps(self, rank: int) -> str:
        return f"{self._steps_base}{rank}"

    def _change(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        """Run one changing ``script``: replicated when the queue is, else retried as every call is."""
        if self._replicated is None:
            return self._retrying(script, keys, args)
        return self._replicated(lambda pipe: script(keys, args, client=pipe))

    def declare(self, keys: Iterable[str]) -> int:
        wanted = list(dict.fromkeys(check_key(key) for key in keys))
        return sum(int(self._change(self._declare, [self._gen], list(chunk))) for chunk in _chunks(wanted))

    def generations(self, keys: Sequence[str]) -> list[int | None]:
        out: list[int | None] = []
        for chunk in _chunks(list(keys)):
            values = self._retrying(self._redis.hmget, self._gen, list(chunk))
            out += [None if value is None else int(value) for value in values]
        return out

    def claim(self, expected: Mapping[str, int]) -> dict[str, int]:
        claimed: dict[str, int] = {}
        for chunk in _chunks(list(expected.items())):
            args = [secrets.token_hex(8)] + [item for key, generation in chunk for item in (key, generation)]
            for name in map(reply_text, self._change(self._claim, [self._gen, self._trained, self._owner], args)):
                claimed[name] = expected[name] + 1
        return claimed

    def admit(self, samples: Sequence[tuple[str, int]]) -> list[bool]:
        out: list[bool] = []
        for chunk in _chunks(list(samples)):
            args = [item for key, generation in chunk for item in (key, generation)]
            out += [bool(flag) for flag in self._retrying(self._admit, [self._gen, self._trained], args)]
        return out

    def restore(self, rank: int, step: int) -> Restore:
        check_rank_step(rank, step)
        keys = [self._ranks, self._steps(rank), self._trained, self._counts, self._restores]
        incarnation, later = self._change(self._restore, keys, [rank, step, secrets.token_hex(8)])
        return Restore(rank, step, int(incarnation), tuple(reply_text(key) for key in later))

    def commit(self, rank: int, incarnation: int, step: int, keys: Sequence[str]) -> int:
        check_rank_step(rank, step)
        names = [self._ranks, self._steps(rank), self._trained, self._gen, self._counts]
        ok, value = self._change(self._commit, names, [rank, incarnation, step, *keys])
        if not int(ok):
            raise StaleTrainer(
                f"rank {rank} incarnation {incarnation} may not commit step {step}: the rank was restored "
                f"since (latest incarnation {reply_text(value) or None}); a newer trainer owns this rank"
            )
        return int(value)

    def progress(self) -> LedgerProgress:
        def read() -> list[Any]:
            with self._redis.pipeline(transaction=True) as pipe:
                pipe.hlen(self._gen)
                pipe.hlen(self._trained)
                pipe.hmget(self._counts, ["restores", "duplicates"])
                return pipe.execute()  # type: ignore[no-any-return]

        declared, trained, (restores, duplicates) = self._retrying(read)
        return LedgerProgress(int(declared), int(trained), int(restores or 0), int(duplicates or 0))

    def history(self, rank: int) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for key, step in self._retrying(self._redis.zrange, self._steps(rank), 0, -1, withscores=True):
            out.setdefault(int(step), []).append(reply_text(key))
        return dict(sorted(out.items()))

    def holds(self, sample_ids: Sequence[str]) -> set[str]:
        return self._holds(sample_ids)
