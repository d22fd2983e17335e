"""The Redis backend's faults for the stateful kit: replies lost (``RedisLostReplies``) and the primary lost
(``RedisFailovers``), each patched into one ``RedisSampleRefQueue``'s link.

``make_queue_machine(..., replies=RedisLostReplies, failovers=lambda queue: RedisFailovers(queue, cluster))``
runs the kit with both; the failovers need the queue connected through the sentinels of ``cluster``, a
``ReplicatedRedis`` (``featurestream.tools.redis_servers``).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Collection
from typing import Any

import redis

from featurestream.backends.redis.queue import RedisSampleRefQueue
from featurestream.testing.faults import FAILOVER_MOMENTS
from featurestream.tools.redis_servers import RedisNode, ReplicatedRedis

__all__ = ["FUNCTION_OF", "RedisFailovers", "RedisLostReplies"]

# The server function behind each queue call whose reply can be lost.
FUNCTION_OF = {
    "put": "put",
    "put_many": "put_many",
    "ack": "ack",
    "ack_many": "ack",
    "fail": "fail",
    "fail_many": "fail",
    "lose": "lose",
    "extend": "extend",
    "reclaim_expired": "reclaim",
    "requeue_dead_letters": "requeue",
    "purge_dead_letters": "purge",
}

# A failover's whole course (promotion, the old primary's restart and resync: ``ReplicatedRedis`` gives each
# 30 s) and the call it holds up, at most.
FAILOVER_BOUND = 120.0


class RedisLostReplies:
    """``LosesReplies`` for one ``RedisSampleRefQueue``: an armed server function runs, and its reply is lost.

    The queue's link sends a call on its own connection first, or (``min_replicas``) as a pipeline with the
    ``WAIT`` that holds its reply until replicas have it; this drops the reply of that first attempt, so the
    client sees the connection error a lost reply gives and retries (through redis-py's path, or the pipeline
    again), and the retries go through: each armed call loses one reply. ``always`` names queue calls whose
    every first reply is lost, whatever ``clear``.
    """

    def __init__(self, queue: RedisSampleRefQueue, always: Collection[str] = ()) -> None:
        self._lock = threading.Lock()
        self._armed: dict[str, int | None] = {}
        self._always = {FUNCTION_OF[call] for call in always}
        self.lost_of: collections.Counter[str] = collections.Counter()  # replies lost, by server function
        link = queue._link
        send, attempt = link._request, link._attempt
        called_as = {queue._library.function(function): function for function in FUNCTION_OF.values()}
        attempted: set[str] = set()  # the replicated calls (by call id) sent once: a retry is never lost

        def request(conn: Any, called: str, header: str, args: tuple[Any, ...]) -> Any:
            reply = send(conn, called, header, args)
            self._lose(called_as.get(called))
            return reply

        def replicated(commands: Callable[[redis.client.Pipeline], object], give_up: float) -> tuple[int, Any]:
            sent: list[tuple[str, str]] = []  # (function, call id) of the FCALL, if the commands are one

            def noting(pipe: redis.client.Pipeline) -> None:
                commands(pipe)
                command = pipe.command_stack[-1][0]
                if command[0] == "FCALL":
                    sent.append((str(command[1]), str(command[4]).rsplit("\t", 1)[1]))

            reply = attempt(noting, give_up)
            if sent and sent[0][1] not in attempted:
                attempted.add(sent[0][1])
                self._lose(called_as.get(sent[0][0]))
            return reply

        link._request = request  # type: ignore[method-assign]
        link._attempt = replicated  # type: ignore[method-assign]

    def _lose(self, function: str | None) -> None:
        """Raise the connection error of a lost reply when ``function``'s reply is to be lost."""
        with self._lock:
            if function is None or (function not in self._always and function not in self._armed):
                return
            left = self._armed.get(function)
            if function not in self._always and left is not None:
                if left <= 1:
                    del self._armed[function]
                else:
                    self._armed[function] = left - 1
            self.lost_of[function] += 1
        raise redis.ConnectionError("the reply was lost")

    def arm(self, call: str, times: int | None = 1) -> None:
        with self._lock:
            self._armed[FUNCTION_OF[call]] = times

    def clear(self) -> None:
        with self._lock:
            self._armed.clear()

    def armed(self) -> bool:
        with self._lock:
            return bool(self._armed)

    def lost(self) -> int:
        with self._lock:
            return sum(self.lost_of.values())


class RedisFailovers:
    """``FailsOver`` for one ``RedisSampleRefQueue`` connected through the sentinels of ``cluster``.

    The next server call after ``arm`` (made on the thread that armed it: a blocked producer's thread never takes
    it) meets the loss of its primary, SIGKILLed ``at``:

    - ``"unreplicated"``: the replicas stopped and cut off, the call runs on the primary alone, which dies while
      the call waits for a replica (``WAIT``), or as soon as it returned if its link does not wait: its effect
      dies with the primary, and the call must run it again on the promoted replica.
    - ``"replicated"``: the replicas stopped, not cut off: the effect reaches them but the reply dies with the
      primary, and the retry must be answered with the first run's reply.
    - ``"returned"``: just after the call returned: what it reported must be on the promoted replica.

    Then a replica is promoted at once, the old primary restarted as a replica and the cluster left healthy
    before the call returns to the machine; ``done`` counts the failovers by moment, ``promoted`` lists the
    servers promoted, in order (a sentinel of a busy machine may fail over again later, on its own).
    """

    def __init__(self, queue: RedisSampleRefQueue, cluster: ReplicatedRedis) -> None:
        self._cluster = cluster
        self._lock = threading.Lock()
        self._armed: tuple[str, int] | None = None  # (moment, arming thread)
        self.done: collections.Counter[str] = collections.Counter()
        self.promoted: list[RedisNode] = []
        link = queue._link
        call = link.call

        def failing_over(script: str, header: Callable[[str], str], *args: Any) -> Any:
            at = self._take()
            if at is None:
                return call(script, header, *args)
            return self._around(at, lambda: call(script, header, *args))

        link.call = failing_over  # type: ignore[method-assign]

    def _take(self) -> str | None:
        with self._lock:
            if self._armed is None or self._armed[1] != threading.get_ident():
                return None
            at = self._armed[0]
            self._armed = None
            return at

    def _around(self, at: str, call: Callable[[], Any]) -> Any:
        """``call()`` with the primary lost ``at`` its moment; returns (or raises) what the call did."""
        cluster = self._cluster
        if at == "returned":
            try:
                return call()
            finally:
                old = cluster.kill_primary()
                self._replace(old)
                self._count(at)
        returned = threading.Event()
        failed: list[BaseException] = []
        with cluster.replicas_stopped(cut=at == "unreplicated") as primary:
            helper = threading.Thread(target=self._kill_in_flight, args=(primary, returned, failed), daemon=True)
            helper.start()
            try:
                return call()
            finally:
                returned.set()
                helper.join(FAILOVER_BOUND)
                if helper.is_alive() or failed:
                    raise AssertionError(f"the {at} failover did not complete: {failed or 'it hung'}")
                self._count(at)

    def _count(self, at: str) -> None:
        with self._lock:
            self.done[at] += 1

    def _kill_in_flight(self, primary: RedisNode, returned: threading.Event, failed: list[BaseException]) -> None:
        """SIGKILL ``primary`` once the call waits for a replica on it (or returned), then ``_replace`` it."""
        try:
            while not returned.is_set() and not self._cluster.waiting(primary):
                returned.wait(0.002)
            primary.stop(kill=True)
            self._cluster.resume()  # the stopped replicas run again, to be promoted
            self._replace(primary)
        except BaseException as exc:  # re-raised on the call's thread
            failed.append(exc)

    def _replace(self, old: RedisNode) -> None:
        """A replica promoted in place of the dead ``old``, which rejoins as a replica; the cluster healthy."""
        promoted = self._cluster.promote(old)
        with self._lock:
            self.promoted.append(promoted)
        self._cluster.restart(old)
        self._cluster.wait_healthy()

    def arm(self, at: str) -> None:
        if at not in FAILOVER_MOMENTS:
            raise ValueError(f"cannot fail over at {at!r}: the moments are {FAILOVER_MOMENTS}")
        with self._lock:
            self._armed = (at, threading.get_ident())

    def clear(self) -> None:
        with self._lock:
            self._armed = None

    def armed(self) -> bool:
        with self._lock:
            return self._armed is not None

    def failovers(self) -> int:
        with self._lock:
            return sum(self.done.values())
