---------------------------- MODULE OrphanReclaim ----------------------------
(***************************************************************************)
(* Orphan reclaim (docs/data-plane.md, stores/shared_dir.py): bytes a     *)
(* producer stored for a sample that never reaches the queue are freed    *)
(* without an operator, and the reclaim never frees what the queue holds. *)
(*                                                                         *)
(* Each sample has its writer: the producer process that stores it (its   *)
(* store instance holds a liveness token the OS releases when the process *)
(* dies), retains it (the store's queued marker, written before the       *)
(* enqueue) and sends the enqueue to the queue's server.  The writer may  *)
(* crash at any step: after the store, after the retain, with the enqueue *)
(* in flight (it still lands), or later (then a purge's scrub, which the  *)
(* queue hands to the writer, never comes).  Consumers lease, ack (the    *)
(* acker scrubs) or fail the sample into a kept dead letter, which an     *)
(* operator purges.                                                       *)
(*                                                                         *)
(* The reclaim is a sweep any store instance runs (the queue's reaper):   *)
(* it notes a writer it finds dead, lets the grace period pass, and then  *)
(* frees a sample of that writer unless the sample carries no queued      *)
(* marker... or it does and the queue (asked at that moment) holds it     *)
(* neither pending, leased nor as a kept dead letter.  The grace period   *)
(* is the one timing assumption: an enqueue a writer sent before it died  *)
(* reaches the server within it (Elapse waits for in-flight enqueues).   *)
(*                                                                         *)
(* Safety: nothing queued or leased is ever freed by the reclaim          *)
(* (ReclaimNeverFreesHeld), and a queued or leased sample has its bytes   *)
(* unless they were lost (QueuedResident).  Liveness: every stored sample *)
(* is eventually queued or freed, and one the queue lets go of is freed   *)
(* (EveryStoredQueuedOrFreed).                                            *)
(* Plain TLC, deadlock checking on: the end of the run is the step Done.  *)
(*                                                                         *)
(* The data plane's other ends (docs/data-plane.md, "A drained run"):  *)
(* a writer's clean exit (queue.close(); store.close()) frees only what   *)
(* no queue holds (a sample without a queued marker) and gives its token  *)
(* up; bytes a queue holds may vanish anyway (an operator deletes the     *)
(* file, a disk is wiped), and the consumer whose read finds them gone    *)
(* dead-letters the sample as lost at once; the queue may be closed, and  *)
(* an enqueue that lands after that is refused (a live writer unretains); *)
(* once the queue is closed and drained no enqueue can land any more, so  *)
(* a sweep with the drained queue's answer frees what writers no longer   *)
(* alive left without waiting out the grace period (DrainSweep).          *)
(* QueuedResident: a sample the queue holds is resident unless its bytes  *)
(* were lost.  DrainedRunEmpties: once the queue is drained and every     *)
(* writer gone, every byte not kept for a dead letter goes.               *)
(*                                                                         *)
(* Mutants: BugNeverReclaim (the stores before the reclaim: the sweep    *)
(* runs and frees nothing, so a crashed writer's bytes stay for ever and  *)
(* the liveness fails) and                                                *)
(* BugReclaimWithoutGrace (a dead writer's samples are freed as soon as   *)
(* it is seen dead: its in-flight enqueue lands on freed bytes, the       *)
(* safety fails), BugCloseUnlinksQueued (a writer's close frees every   *)
(* sample it wrote, queued ones too: a consumer then finds them gone,     *)
(* QueuedResident fails) and BugSweepUndrained (the drained sweep's no-   *)
(* grace rule used while the queue is open: an in-flight enqueue lands on *)
(* freed bytes).                                                          *)
(***************************************************************************)
EXTENDS Naturals

CONSTANTS
    Samples,                 \* one writer (producer process) per sample
    BugNeverReclaim,         \* no sweep ever frees anything
    BugReclaimWithoutGrace,  \* the sweep frees a dead writer's sample without waiting out the grace period
    BugCloseUnlinksQueued,   \* a writer's close frees its samples whether or not a queue holds them
    BugSweepUndrained        \* the no-grace sweep runs whether or not the queue is drained

\* The queue's view of a sample: not sent (or its enqueue refused), enqueue in flight, pending, leased, acked, kept
\* dead letter, purged, dead-lettered as lost (nothing kept).
QueueStates == {"none", "inflight", "pending", "leased", "acked", "dead", "purged", "lost"}
\* What the queue holds, as the sweep's read of it answers.
Held == {"pending", "leased", "dead"}
\* The producer's steps: nothing yet, stored, retained, enqueue sent, put refused (its bytes were gone).
Steps == {"idle", "stored", "retained", "sent", "refused"}

VARIABLES
    pc,         \* the writer's progress on its sample
    alive,      \* whether the writer's process lives (its liveness token held)
    bytes,      \* whether the store holds the sample's bytes
    marker,     \* whether the sample's queued marker exists
    q,          \* the queue's state of the sample
    seen,       \* the sweep's note of the writer: "no", "dead" (seen dead), "grace" (seen dead a grace period ago)
    reclaimed,  \* whether the reclaim freed the sample (rather than a scrub)
    lost,       \* whether the sample's bytes vanished under the queue (deleted by something other than the store)
    qclosed     \* whether the queue is closed (puts refused)

vars == <<pc, alive, bytes, marker, q, seen, reclaimed, lost, qclosed>>

TypeOK ==
    /\ pc \in [Samples -> Steps]
    /\ alive \in [Samples -> BOOLEAN]
    /\ bytes \in [Samples -> BOOLEAN]
    /\ marker \in [Samples -> BOOLEAN]
    /\ q \in [Samples -> QueueStates]
    /\ seen \in [Samples -> {"no", "dead", "grace"}]
    /\ reclaimed \in [Samples -> BOOLEAN]
    /\ lost \in [Samples -> BOOLEAN]
    /\ qclosed \in BOOLEAN

(* Closed, with nothing pending or leased: the server reports drained (an enqueue still in flight is refused). *)
Drained == qclosed /\ \A s \in Samples : q[s] \notin {"pending", "leased"}

Free(s) == bytes' = [bytes EXCEPT ![s] = FALSE] /\ marker' = [marker EXCEPT ![s] = FALSE]

(* -- the producer (the writer), while it lives --------------------------- *)
Store(s) ==
    /\ alive[s] /\ pc[s] = "idle"
    /\ pc' = [pc EXCEPT ![s] = "stored"]
    /\ bytes' = [bytes EXCEPT ![s] = TRUE]
    /\ UNCHANGED <<alive, marker, q, seen, reclaimed, lost, qclosed>>

(* queue.put: the residency check and the retain (the marker), before anything reaches the server. *)
Retain(s) ==
    /\ alive[s] /\ pc[s] = "stored"
    /\ IF bytes[s]
       THEN /\ pc' = [pc EXCEPT ![s] = "retained"]
            /\ marker' = [marker EXCEPT ![s] = TRUE]
       ELSE /\ pc' = [pc EXCEPT ![s] = "refused"]   \* NotResident: nothing is enqueued
            /\ UNCHANGED marker
    /\ UNCHANGED <<alive, bytes, q, seen, reclaimed, lost, qclosed>>

Send(s) ==
    /\ alive[s] /\ pc[s] = "retained"
    /\ pc' = [pc EXCEPT ![s] = "sent"]
    /\ q' = [q EXCEPT ![s] = "inflight"]
    /\ UNCHANGED <<alive, bytes, marker, seen, reclaimed, lost, qclosed>>

(* The writer's process dies (SIGKILL): the OS releases its liveness token. *)
Crash(s) ==
    /\ alive[s]
    /\ alive' = [alive EXCEPT ![s] = FALSE]
    /\ UNCHANGED <<pc, bytes, marker, q, seen, reclaimed, lost, qclosed>>

(* The writer's clean exit (queue.close(); store.close(); exit), never inside a put (retained and not yet sent,
   or an enqueue still unanswered): its store frees what no queue holds -- a sample without a queued marker --
   and its liveness token goes. *)
WriterClose(s) ==
    /\ alive[s] /\ pc[s] # "retained" /\ q[s] # "inflight"
    /\ IF BugCloseUnlinksQueued \/ ~marker[s]
       THEN Free(s)
       ELSE UNCHANGED <<bytes, marker>>
    /\ alive' = [alive EXCEPT ![s] = FALSE]
    /\ UNCHANGED <<pc, q, seen, reclaimed, lost, qclosed>>

(* -- the queue's server and its consumers ---------------------------------- *)
(* An enqueue reaches the server: queued, or refused by a closed queue (a live writer hears it and unretains; a
   dead one's marker stays for the sweep). *)
Land(s) ==
    /\ q[s] = "inflight"
    /\ IF qclosed
       THEN /\ q' = [q EXCEPT ![s] = "none"]
            /\ marker' = IF alive[s] THEN [marker EXCEPT ![s] = FALSE] ELSE marker
            /\ pc' = IF alive[s] THEN [pc EXCEPT ![s] = "refused"] ELSE pc
       ELSE /\ q' = [q EXCEPT ![s] = "pending"]
            /\ UNCHANGED <<pc, marker>>
    /\ UNCHANGED <<alive, bytes, seen, reclaimed, lost, qclosed>>

(* queue.close(), by any instance: later puts are refused. *)
CloseQueue ==
    /\ ~qclosed
    /\ qclosed' = TRUE
    /\ UNCHANGED <<pc, alive, bytes, marker, q, seen, reclaimed, lost>>

Lease(s) ==
    /\ q[s] = "pending"
    /\ q' = [q EXCEPT ![s] = "leased"]
    /\ UNCHANGED <<pc, alive, bytes, marker, seen, reclaimed, lost, qclosed>>

(* The acker's store scrubs the bytes and the marker, whoever wrote them. *)
Ack(s) ==
    /\ q[s] = "leased"
    /\ q' = [q EXCEPT ![s] = "acked"]
    /\ Free(s)
    /\ UNCHANGED <<pc, alive, seen, reclaimed, lost, qclosed>>

(* Out of deliveries with its bytes kept: a dead letter the queue still holds. *)
Fail(s) ==
    /\ q[s] = "leased"
    /\ q' = [q EXCEPT ![s] = "dead"]
    /\ UNCHANGED <<pc, alive, bytes, marker, seen, reclaimed, lost, qclosed>>

(* The bytes of a sample the queue holds vanish anyway (an operator deletes the file, a disk is wiped, Mooncake
   loses the object); once per model. *)
LoseBytes(s) ==
    /\ q[s] \in {"pending", "leased"} /\ bytes[s] /\ \A t \in Samples : ~lost[t]
    /\ bytes' = [bytes EXCEPT ![s] = FALSE]
    /\ lost' = [lost EXCEPT ![s] = TRUE]
    /\ UNCHANGED <<pc, alive, marker, q, seen, reclaimed, qclosed>>

(* The consumer's read finds them gone: dead-lettered as lost at once (never redelivered), its marker scrubbed. *)
ReadLost(s) ==
    /\ q[s] = "leased" /\ lost[s] /\ ~bytes[s]
    /\ q' = [q EXCEPT ![s] = "lost"]
    /\ marker' = [marker EXCEPT ![s] = FALSE]
    /\ UNCHANGED <<pc, alive, bytes, seen, reclaimed, lost, qclosed>>

(* An operator purges the dead letter: its scrub is handed to the writer's instance. *)
Purge(s) ==
    /\ q[s] = "dead"
    /\ q' = [q EXCEPT ![s] = "purged"]
    /\ UNCHANGED <<pc, alive, bytes, marker, seen, reclaimed, lost, qclosed>>

PurgeScrub(s) ==
    /\ q[s] = "purged" /\ alive[s] /\ bytes[s]
    /\ Free(s)
    /\ UNCHANGED <<pc, alive, q, seen, reclaimed, lost, qclosed>>

(* -- the reclaim: any store instance's sweep --------------------------------- *)
(* It finds the writer's liveness token free: the writer is dead. *)
Observe(s) ==
    /\ ~alive[s] /\ seen[s] = "no" /\ bytes[s]
    /\ seen' = [seen EXCEPT ![s] = "dead"]
    /\ UNCHANGED <<pc, alive, bytes, marker, q, reclaimed, lost, qclosed>>

(* The grace period passes; an enqueue the writer sent before dying has landed by then (the assumption). *)
Elapse(s) ==
    /\ seen[s] = "dead" /\ q[s] # "inflight"
    /\ seen' = [seen EXCEPT ![s] = "grace"]
    /\ UNCHANGED <<pc, alive, bytes, marker, q, reclaimed, lost, qclosed>>

Reclaim(s) ==
    /\ bytes[s]
    /\ IF BugReclaimWithoutGrace THEN seen[s] # "no" ELSE seen[s] = "grace"
    /\ (~marker[s] \/ q[s] \notin Held)   \* no queued marker, or the queue says it holds it no more
    /\ IF BugNeverReclaim
       THEN UNCHANGED vars                  \* the sweep runs and frees nothing
       ELSE /\ Free(s)
            /\ reclaimed' = [reclaimed EXCEPT ![s] = TRUE]
            /\ UNCHANGED <<pc, alive, q, seen, lost, qclosed>>

(* The sweep of an instance whose queue is closed and drained (its last clean close): no enqueue can land any
   more, so the samples of writers no longer alive (dead, or closed) go at once, without the grace period --
   unless marked and still held (a kept dead letter). *)
DrainSweep(s) ==
    /\ Drained \/ BugSweepUndrained
    /\ bytes[s] /\ ~alive[s]
    /\ (~marker[s] \/ q[s] \notin Held)
    /\ Free(s)
    /\ reclaimed' = [reclaimed EXCEPT ![s] = TRUE]
    /\ UNCHANGED <<pc, alive, q, seen, lost, qclosed>>

(* The end of the run: every writer finished or dead, nothing held, nothing stored. *)
Done ==
    /\ \A s \in Samples :
        /\ pc[s] \in {"sent", "refused"} \/ ~alive[s]
        /\ q[s] \in {"none", "acked", "purged", "lost"}
        /\ ~bytes[s]
    /\ UNCHANGED vars

Init ==
    /\ pc = [s \in Samples |-> "idle"]
    /\ alive = [s \in Samples |-> TRUE]
    /\ bytes = [s \in Samples |-> FALSE]
    /\ marker = [s \in Samples |-> FALSE]
    /\ q = [s \in Samples |-> "none"]
    /\ seen = [s \in Samples |-> "no"]
    /\ reclaimed = [s \in Samples |-> FALSE]
    /\ lost = [s \in Samples |-> FALSE]
    /\ qclosed = FALSE

Producer(s) == Store(s) \/ Retain(s) \/ Send(s)
Sweep(s) == Observe(s) \/ Elapse(s) \/ Reclaim(s) \/ DrainSweep(s)

Next ==
    \/ \E s \in Samples :
        \/ Producer(s) \/ Crash(s) \/ WriterClose(s)
        \/ Land(s) \/ Lease(s) \/ Ack(s) \/ Fail(s) \/ Purge(s) \/ PurgeScrub(s)
        \/ LoseBytes(s) \/ ReadLost(s)
        \/ Sweep(s)
    \/ CloseQueue
    \/ Done

(* A live producer carries on and eventually exits, the server applies what it received, scrubs owed to a live
   writer happen, the sweeps run and time passes; consumers, the operator and the queue's close need no fairness
   (a held sample may stay held). *)
Fairness ==
    \A s \in Samples :
        /\ WF_vars(Producer(s))
        /\ WF_vars(WriterClose(s))
        /\ WF_vars(DrainSweep(s))
        /\ WF_vars(Land(s))
        /\ WF_vars(PurgeScrub(s))
        /\ WF_vars(Observe(s))
        /\ WF_vars(Elapse(s))
        /\ WF_vars(Reclaim(s))

Spec == Init /\ [][Next]_vars /\ Fairness

(* Safety: the reclaim never frees a sample the queue holds (pending, leased, or a kept dead letter). *)
ReclaimNeverFreesHeld == \A s \in Samples : reclaimed[s] => q[s] \notin Held
(* A sample the queue holds, which a consumer may lease, has its bytes unless they were lost (not by the store). *)
QueuedResident == \A s \in Samples : q[s] \in Held => bytes[s] \/ lost[s]

(* Liveness: stored bytes are eventually the queue's, or freed; once the queue lets go of them, freed. *)
EveryStoredQueuedOrFreed == \A s \in Samples : bytes[s] ~> (~bytes[s] \/ q[s] \in Held)
(* A drained run whose writers are all gone ends with nothing stored but kept dead letters. *)
DrainedRunEmpties ==
    (Drained /\ \A s \in Samples : ~alive[s]) ~> (\A s \in Samples : ~bytes[s] \/ q[s] = "dead")
=============================================================================
