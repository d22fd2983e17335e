"""Stateful tests of resuming (``spec/Resume.tla``'s actions) against a real queue backend and its ledger.

``make_resume_machine(queue_factory)`` returns a Hypothesis
``RuleBasedStateMachine`` whose rules are the actions of ``spec/Resume.tla``
applied to a queue of yours (``queue_factory(store, clock)``), its training
ledger and the pipeline's resume code: the producer's observe (the ledger's
generations and the queue's held samples) and claim, produce and put, its
crash; the trainer's pull (``TrainerResume.admit``), train, commit, ack,
save, a lease that expires mid-step, its crash and restore from the latest
checkpoint. After every rule the model holds no prompt twice (nor the
checkpoint) and the ledger's history matches the model; at the end, a crash
free run from there must train every prompt (the spec's liveness, for the
finite run)::

    from featurestream.testing.resume_machine import make_resume_machine
    TestMyQueue = make_resume_machine(lambda store, clock: MyQueue(store, clock=clock)).TestCase
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from featurestream.core.lease import Lease
from featurestream.core.protocol import LeaseQueue
from featurestream.core.resume import parse_sample_id, sample_id_for
from featurestream.pipeline.async_pipeline import prompt_kwargs
from featurestream.pipeline.producer import FeatureProducer
from featurestream.pipeline.resume import TrainerResume, ledger_of
from featurestream.stores.base import FeatureStore
from featurestream.stores.local import LocalFeatureStore
from featurestream.testing.clock import FakeClock
from featurestream.testing.resume import KeyTarget, prompts

__all__ = ["make_resume_machine"]

QueueFactory = Callable[[FeatureStore, FakeClock], LeaseQueue]

KEYS = ("0", "1", "2")
MAX_CRASHES = 3
MAX_GEN = MAX_CRASHES + 1  # the spec's bound on a prompt's generations
# Longer than any visibility timeout the machine's queues use: advancing the clock by it expires every lease.
EXPIRY = 1_000.0
# Crash-free rounds the final run may take to train every prompt (each round: one plan and one step per prompt).
FINAL_ROUNDS = 4 * len(KEYS)

_key = st.sampled_from(KEYS)


def make_resume_machine(
    queue_factory: QueueFactory, *, name: str = "ResumeMachine", traces: list[list[dict[str, Any]]] | None = None
) -> type[RuleBasedStateMachine]:
    """A state machine class running ``spec/Resume.tla``'s actions on ``queue_factory(store, clock)``'s queue.

    With ``traces``, each run appends its behaviour there: the state after
    its start and after every rule, as the spec's variables (the ledger's and
    the queue's read from them), for ``featurestream.spec.resume_trace``.
    """

    class Machine(_ResumeMachine):
        make_queue = staticmethod(queue_factory)
        recorded = traces

    Machine.__name__ = Machine.__qualname__ = name
    return Machine


class _ResumeMachine(RuleBasedStateMachine):
    make_queue: Callable[[FeatureStore, FakeClock], LeaseQueue]
    recorded: list[list[dict[str, Any]]] | None = None

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.store = LocalFeatureStore(max_samples=64)
        self.queue = self.make_queue(self.store, self.clock)
        self.ledger = ledger_of(self.queue)
        self.ledger.declare(KEYS)
        self.prompts = dict(zip(KEYS, prompts(len(KEYS)), strict=True))
        self.producer = FeatureProducer(KeyTarget(), self.store, run_id="machine")
        self.crashes = 0
        # the producer's volatile state: generations it observed as not queued, samples claimed and not put
        self.seen: dict[str, int] = {}
        self.inflight: dict[str, int] = {}
        self.producing = True
        # the trainer's volatile state, and its durable checkpoint
        self.trainer: TrainerResume | None = self._new_trainer(0)
        self.model: list[str] = []
        self.held: Lease | None = None
        self.phase = "idle"
        self.expired = False
        self.checkpoint: tuple[int, list[str]] = (0, [])
        self.trace: list[dict[str, Any]] | None = None
        if self.recorded is not None:
            self.trace = []
            self.recorded.append(self.trace)

    def _new_trainer(self, step: int) -> TrainerResume:
        trainer = TrainerResume(self.ledger, 0, 1)
        trainer.begin(step)
        return trainer

    def teardown(self) -> None:
        """The spec's liveness for this finite run: from here, crash free, every prompt is trained once."""
        try:
            model = self.finish()
            assert sorted(model) == sorted(KEYS), f"the crash-free end trained {model}, not every prompt once"
            self.at_most_once()
        finally:
            disconnect = getattr(self.queue, "disconnect", None)
            if callable(disconnect):
                disconnect()

    # -- the producer ------------------------------------------------------------
    @precondition(lambda self: self.producing)
    @rule(key=_key)
    def observe(self, key: str) -> None:
        """ResumableProducer.produce_missing's reads: the current generation, then whether the queue holds it."""
        if key in self.seen or key in self.inflight:
            return
        (generation,) = self.ledger.generations([key])
        assert generation is not None, f"key {key!r} was declared"
        if generation >= MAX_GEN:
            return
        if generation and self.ledger.holds([sample_id_for("machine", key, generation)]):
            return
        self.seen[key] = generation

    @precondition(lambda self: self.producing and self.seen)
    @rule(data=st.data())
    def claim(self, data: st.DataObject) -> None:
        self.claim_key(data.draw(st.sampled_from(sorted(self.seen))))

    @precondition(lambda self: self.producing and self.inflight)
    @rule(data=st.data())
    def put(self, data: st.DataObject) -> None:
        self.put_key(data.draw(st.sampled_from(sorted(self.inflight))))

    def claim_key(self, key: str) -> None:
        """TrainingLedger.claim of the generation observed: a new one if the key is untrained and unchanged."""
        self.inflight.update(self.ledger.claim({key: self.seen.pop(key)}))

    def put_key(self, key: str) -> None:
        sample_id = sample_id_for("machine", key, self.inflight.pop(key))
        self.queue.put(self.producer.produce(**prompt_kwargs(self.prompts[key]), sample_id=sample_id))

    @precondition(lambda self: self.producing and self.crashes < MAX_CRASHES)
    @rule()
    def producer_crash(self) -> None:
        self.producing, self.crashes = False, self.crashes + 1
        self.seen, self.inflight = {}, {}

    @precondition(lambda self: not self.producing)
    @rule()
    def producer_restart(self) -> None:
        self.producing = True

    # -- the trainer -------------------------------------------------------------
    @precondition(lambda self: self.trainer is not None and self.phase == "idle")
    @rule()
    def pull(self) -> None:
        """The loader's pull: lease, and ``TrainerResume.admit`` drops what may not train."""
        assert self.trainer is not None
        lease = self.queue.acquire(timeout=0)
        if lease is None:
            return
        if self.trainer.admit(self.queue, [lease]):
            self.held, self.phase, self.expired = lease, "holding", False

    @precondition(lambda self: self.phase == "holding")
    @rule()
    def train(self) -> None:
        assert self.held is not None
        parsed = parse_sample_id(self.held.ref.sample_id)
        assert parsed is not None, self.held.ref.sample_id
        self.model.append(parsed[0])
        self.phase = "trained"

    @precondition(lambda self: self.phase == "trained")
    @rule()
    def commit(self) -> None:
        assert self.trainer is not None and self.held is not None
        self.trainer.commit([self.held])
        self.phase = "committed"

    @precondition(lambda self: self.phase == "committed")
    @rule()
    def ack(self) -> None:
        """An expired lease's ack is stale and changes nothing: its sample was redelivered."""
        assert self.held is not None
        self.queue.ack(self.held)
        self.held, self.phase = None, "idle"

    @precondition(lambda self: self.phase != "idle")
    @rule()
    def expire(self) -> None:
        """The step outlives the visibility timeout: the held batch's lease is reclaimed."""
        self.clock.advance(EXPIRY)
        self.queue.reclaim_expired()
        self.expired = True

    @precondition(lambda self: self.trainer is not None and self.phase == "idle")
    @rule()
    def save(self) -> None:
        assert self.trainer is not None
        state = self.trainer.state()
        assert state["step"] == len(self.model), (state, self.model)
        self.checkpoint = (state["step"], list(self.model))

    @precondition(lambda self: self.trainer is not None and self.crashes < MAX_CRASHES)
    @rule()
    def trainer_crash(self) -> None:
        """SIGKILL: the model and the held batch are lost; the lease is reclaimed once it expires."""
        self.trainer, self.model, self.held, self.phase, self.expired = None, [], None, "idle", False
        self.crashes += 1
        self.clock.advance(EXPIRY)
        self.queue.reclaim_expired()

    @precondition(lambda self: self.trainer is None)
    @rule()
    def trainer_restore(self) -> None:
        step, model = self.checkpoint
        self.trainer = self._new_trainer(step)
        self.model = list(model)

    # -- the properties ----------------------------------------------------------
    @invariant()
    def at_most_once(self) -> None:
        for history in (self.model, self.checkpoint[1]):
            assert len(history) == len(set(history)), f"a prompt trained twice: {history}"

    @invariant()
    def ledger_matches_model(self) -> None:
        if self.trainer is None:
            return
        history = self.ledger.history(0)
        for step, keys in history.items():
            assert step <= len(self.model) and keys == [self.model[step - 1]], (history, self.model)

    @invariant()
    def record(self) -> None:
        """Append the state, as the spec's variables, to this run's trace (when recording)."""
        if self.trace is None:
            return
        trained = dict.fromkeys(KEYS, 0)
        for step, keys in self.ledger.history(0).items():
            trained.update(dict.fromkeys(keys, step))
        candidates = {sample_id_for("machine", k, g): [k, g] for k in KEYS for g in range(1, MAX_GEN + 1)}
        held = self.ledger.holds(list(candidates))
        batch = None
        if self.held is not None:
            parsed = parse_sample_id(self.held.ref.sample_id)
            assert parsed is not None
            batch = list(parsed)
        self.trace.append(
            {
                "gen": dict(zip(KEYS, self.ledger.generations(KEYS), strict=True)),
                "trained": trained,
                "queue": sorted(candidates[sample_id] for sample_id in held),
                "alive": self.trainer is not None,
                "model": list(self.model),
                "batch": batch,
                "phase": self.phase,
                "expired": self.expired,
                "ckpt": {"step": self.checkpoint[0], "model": list(self.checkpoint[1])},
                "palive": self.producing,
                "seen": {key: self.seen.get(key, -1) for key in KEYS},
                "inflight": sorted([key, generation] for key, generation in self.inflight.items()),
                "crashes": self.crashes,
            }
        )

    def finish(self) -> list[str]:
        """Run crash free to the end (the spec's fairness, for a finite run); return the model it ends with."""
        self.trace = None  # the run's behaviour ends here: the rest is the test's, not the spec's
        self.producing = True
        if self.trainer is None:
            self.trainer_restore()
        for _ in range(FINAL_ROUNDS):
            for step in (self.train, self.commit, self.ack):  # the step in progress, if any, completes
                if self.phase == {"train": "holding", "commit": "trained", "ack": "committed"}[step.__name__]:
                    step()
            for key in KEYS:
                self.observe(key)
            while self.seen:
                self.claim_key(min(self.seen))
            while self.inflight:
                self.put_key(min(self.inflight))
            self.clock.advance(EXPIRY)  # what a killed trainer held is redelivered
            self.queue.reclaim_expired()
            while self.phase == "idle" and self.queue.pending_count():
                self.pull()
            if self.ledger.progress().complete and self.phase == "idle" and not self.queue.pending_count():
                break
        return self.model
