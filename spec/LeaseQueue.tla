----------------------------- MODULE LeaseQueue -----------------------------
(***************************************************************************)
(* The featurestream lease / ack / fail queue with its store residency,   *)
(* backpressure and close/drain lifecycle -- and the world around it:      *)
(* producers that store a sample and block in put_blocks_until_below, and *)
(* a store whose calls may fail.                                           *)
(*                                                                         *)
(* Every delivery attempt of a sample is one lease, <<sample, attempt>>,  *)
(* that walks the lease machine below (featurestream.machines.LEASE).      *)
(* Time is abstract: any live lease may have passed its deadline, so       *)
(* Reclaim may take it at any moment, and Extend changes no variable.      *)
(* Each action names the method of the code it models.  The Python mirror *)
(* (featurestream/spec/mirror.py) has the same variables and actions; a    *)
(* test checks that its reachable-state count equals TLC's.                *)
(*                                                                         *)
(* TLC runs WITH deadlock checking: the only state with nothing left to do *)
(* is the end of the run, and there the explicit step Done is enabled.     *)
(***************************************************************************)
EXTENDS Naturals, Sequences, FiniteSets

\* The lease machine, compared with featurestream.machines.LEASE by a test: keep each on one line.
LeaseStates == {"pending", "leased", "acked", "failed", "reclaimed"}
LeaseTransitions == {<<"Acquire", "pending", "leased">>, <<"Extend", "leased", "leased">>, <<"Ack", "leased", "acked">>, <<"Fail", "leased", "failed">>, <<"Reclaim", "leased", "reclaimed">>, <<"GiveBack", "leased", "pending">>}

CONSTANTS
    Samples,            \* sample ids the producers may write
    Consumers,          \* consumer processes
    MaxDeliveries,      \* SampleRefQueue(max_deliveries=...)
    HighWatermark,      \* pause at/above this many resident bytes
    LowWatermark,       \* resume at/below this many resident bytes
    MaxHeld,            \* leases one consumer holds at once (a model bound)
    SampleBytes,        \* the size of every sample not in LargeSamples
    \* Each switch re-enables one defect of the reference (docs/design.md, defects A-E).
    BugStaleRelease,    \* A: the last handle release frees a sample the queue still holds
    BugNoScrub,         \* B: a settled sample is only un-retained, never scrubbed
    BugNoDedup,         \* C: a re-put of a settled id is accepted
    BugNoDeliveryLimit, \* D: no max_deliveries, no dead letter
    BugNoReaper         \* E: nothing ever reclaims an expired lease

(***************************************************************************)
(* Model parameters with defaults.  A config assigns them exactly like the *)
(* constants above (`Producers = {p1, p2}` under CONSTANTS: TLC replaces   *)
(* the definition).  The defaults -- no producers, no store faults, no     *)
(* eviction from the dedup window, one size -- are the world of the trace  *)
(* validation configs (featurestream.spec.trace), which drive the queue    *)
(* actions directly.                                                       *)
(***************************************************************************)
Producers == {}               \* producer processes (each stores one sample at a time and puts it)
LargeSamples == {}            \* samples of size LargeBytes instead of SampleBytes: mixed sizes
LargeBytes == SampleBytes
MaxFaults == 0                \* how many store calls may fail in one behaviour (each fault is one-shot)
DedupWindow == Cardinality(Samples)  \* SampleRefQueue(dedup_window=...): settled ids remembered, oldest evicted
BugProducerBytesCounted == FALSE     \* the OLD backpressure rule: a paused producer never enqueues
BugScrubFailUnsettles == FALSE       \* the OLD fault behaviour: an ack whose scrub fails is not recorded as settled
KeepDead == FALSE                    \* SampleRefQueue(keep_dead_letter_bytes > 0): a dead letter's bytes stay retained
BugRequeueAnySettled == FALSE        \* requeue_dead_letters takes any settled id, acked or bytes gone (a seeded defect)
MaxSamples == Cardinality(Samples) + 1  \* the store's sample-count cap (max_samples): by default never reached
BugOnlyBytes == FALSE                \* the OLD backpressure rule: only bytes pause producers, not the count cap
MaxLosses == 0                       \* how many samples the store may lose in one behaviour (StoreLoses)
BugLostRedelivered == FALSE          \* a consumer that finds a sample lost fails it like any error (a seeded defect)
Untrainable == {}                    \* samples whose ref the loader's schema refuses: no consumer can train them
BugUntrainedAcked == FALSE           \* LeaseQueue.reject acks the sample instead of dead-lettering it (a seeded defect)
MaxGiveBacks == 0                    \* how many unused leases consumers give back in one behaviour (GiveBackStep)

ASSUME /\ MaxDeliveries \in Nat \ {0}
       /\ LowWatermark \in Nat /\ HighWatermark \in Nat /\ LowWatermark < HighWatermark
       /\ MaxHeld \in Nat \ {0} /\ SampleBytes \in Nat \ {0} /\ LargeBytes \in Nat \ {0}
       /\ LargeSamples \subseteq Samples /\ Untrainable \subseteq Samples
       /\ MaxFaults \in Nat /\ DedupWindow \in Nat \ {0} /\ MaxSamples \in Nat \ {0} /\ MaxLosses \in Nat
       /\ MaxGiveBacks \in Nat
       /\ \A b \in {BugStaleRelease, BugNoScrub, BugNoDedup, BugNoDeliveryLimit, BugNoReaper,
                    BugProducerBytesCounted, BugScrubFailUnsettles, KeepDead, BugRequeueAnySettled,
                    BugOnlyBytes, BugLostRedelivered, BugUntrainedAcked} : b \in BOOLEAN

NoLease == "none"            \* an attempt that was never created
NoSample == "nothing"        \* what an idle producer holds
Attempts == 0..MaxDeliveries \* one slot past the limit, reachable only with BugNoDeliveryLimit
Statuses == {"absent", "stored", "pending", "leased", "acked", "dead", "discarded"}
Terminal == {"acked", "dead"}
HeldByQueue == {"pending", "leased"}
ProducerStates == {"idle", "waiting", "aborted"}

Source(name) == (CHOOSE t \in LeaseTransitions : t[1] = name)[2]
Dest(name) == (CHOOSE t \in LeaseTransitions : t[1] = name)[3]

SampleSize(s) == IF s \in LargeSamples THEN LargeBytes ELSE SampleBytes
MaxSampleSize == IF LargeSamples # {} /\ LargeBytes > SampleBytes THEN LargeBytes ELSE SampleBytes
Max(a, b) == IF a >= b THEN a ELSE b
RECURSIVE Bytes(_)
Bytes(S) == IF S = {} THEN 0 ELSE LET x == CHOOSE x \in S : TRUE IN SampleSize(x) + Bytes(S \ {x})

VARIABLES
    status,        \* [Samples -> Statuses]: the queue-level status of each sample
    queue,         \* the pending FIFO (SampleRefQueue._pending), head first
    deliveries,    \* [Samples -> Attempts]: redelivery_count of the sample's current lease
    lease,         \* [Samples -> [Attempts -> LeaseStates \cup {NoLease}]]: every lease ever made
    held,          \* [Consumers -> SUBSET (Samples \X Attempts)]: lease objects a consumer holds
    handles,       \* [Consumers -> SUBSET Samples]: store handles a consumer knows it holds
    hcount,        \* [Samples -> Nat]: handles the store counts (crashed consumers' included)
    resident,      \* samples whose bytes the store holds
    retained,      \* samples a queue holds (FeatureStore.retain ... scrub / unretain)
    residentBytes, \* the store's byte counter (StoreHealth.resident_bytes)
    bp,            \* backpressure machine: "flowing" | "paused"
    lifecycle,     \* lifecycle machine: "open" | "draining" | "drained"
    window,        \* the dedup window: settled ids, oldest first, at most DedupWindow of them
    backlog,       \* settled (or refused) samples whose scrub (unretain) failed: retried until it succeeds
    faults,        \* store faults that have happened so far (at most MaxFaults)
    kept,          \* dead letters whose bytes stay retained for a requeue (SampleRefQueue._kept)
    pc,            \* [Producers -> ProducerStates]: where each producer is
    owns,          \* [Producers -> Samples \cup {NoSample}]: the sample a producer stored and has not let go
    lost,          \* samples whose bytes the store lost (StoreLoses), until a producer stores the id anew
    givenBack      \* how many unused leases consumers gave back so far (at most MaxGiveBacks)

storeVars == <<resident, retained, hcount, residentBytes>>
faultVars == <<window, backlog, faults, kept>>  \* the queue's settlement bookkeeping and the fault count
envVars == <<pc, owns, lost, givenBack>>  \* the world around the queue: producers, lost bytes, give-backs
vars == <<status, queue, deliveries, lease, held, handles, hcount, resident, retained, residentBytes, bp, lifecycle,
          window, backlog, faults, kept, pc, owns, lost, givenBack>>

TypeOK ==
    /\ status \in [Samples -> Statuses]
    /\ queue \in Seq(Samples)
    /\ deliveries \in [Samples -> Attempts]
    /\ lease \in [Samples -> [Attempts -> LeaseStates \cup {NoLease}]]
    /\ held \in [Consumers -> SUBSET (Samples \X Attempts)]
    /\ handles \in [Consumers -> SUBSET Samples]
    /\ hcount \in [Samples -> Nat]
    /\ resident \subseteq Samples /\ retained \subseteq Samples
    /\ residentBytes \in Nat
    /\ bp \in {"flowing", "paused"}
    /\ lifecycle \in {"open", "draining", "drained"}
    /\ window \in Seq(Samples) /\ Len(window) <= DedupWindow
    /\ backlog \subseteq Samples
    /\ faults \in 0..MaxFaults
    /\ kept \subseteq Samples
    /\ pc \in [Producers -> ProducerStates]
    /\ owns \in [Producers -> Samples \cup {NoSample}]
    /\ lost \subseteq Samples
    /\ givenBack \in 0..MaxGiveBacks

Init ==
    /\ status = [s \in Samples |-> "absent"]
    /\ queue = <<>>
    /\ deliveries = [s \in Samples |-> 0]
    /\ lease = [s \in Samples |-> [k \in Attempts |-> NoLease]]
    /\ held = [c \in Consumers |-> {}]
    /\ handles = [c \in Consumers |-> {}]
    /\ hcount = [s \in Samples |-> 0]
    /\ resident = {} /\ retained = {} /\ residentBytes = 0
    /\ bp = "flowing"
    /\ lifecycle = "open"
    /\ window = <<>> /\ backlog = {} /\ faults = 0 /\ kept = {}
    /\ pc = [p \in Producers |-> "idle"]
    /\ owns = [p \in Producers |-> NoSample]
    /\ lost = {}
    /\ givenBack = 0

(* The lease machine: attempt k of s may take transition `name` iff it is in its source state. *)
CanFire(name, s, k) == lease[s][k] = Source(name)
Fired(name, s, k) == [lease EXCEPT ![s][k] = Dest(name)]

(* The queue holds nothing: no sample is pending or leased. *)
QueueEmpty == \A s \in Samples : status[s] \notin HeldByQueue
QueueEmptyAfter == \A s \in Samples : status'[s] \notin HeldByQueue
InWindow(s) == \E i \in 1..Len(window) : window[i] = s
(* The queue still knows s is settled: in the dedup window, its scrub still being retried, or a dead *)
(* letter whose bytes it keeps (a put of a kept id is refused even after the window evicted it).      *)
KnownSettled(s) == InWindow(s) \/ s \in backlog \/ s \in kept

(* A store call that fails: one of the MaxFaults faults a behaviour may see. *)
Fault == faults < MaxFaults /\ faults' = faults + 1

(* LedgerFeatureStore._forget: the store drops s's bytes and bookkeeping. *)
Free(s) ==
    /\ resident' = resident \ {s}
    /\ retained' = retained \ {s}
    /\ hcount' = [hcount EXCEPT ![s] = 0]
    /\ residentBytes' = residentBytes - (IF s \in resident THEN SampleSize(s) ELSE 0)

(* SampleRefQueue._retire -> FeatureStore.scrub: free a settled sample whatever handles are out. *)
Scrub(s) ==
    IF BugNoScrub /\ hcount[s] > 0
    THEN /\ retained' = retained \ {s}
         /\ UNCHANGED <<resident, hcount, residentBytes>>
    ELSE Free(s)

(* The dedup window after s settles: appended, the oldest id evicted past DedupWindow. *)
Remember(s) == LET w == Append(window, s) IN IF Len(w) > DedupWindow THEN Tail(w) ELSE w

(* The store scrubs s; if that call fails (`fault`), s stays resident and joins the backlog. *)
ScrubOrOwe(s, fault) ==
    IF fault
    THEN /\ Fault
         /\ backlog' = backlog \cup {s}
         /\ UNCHANGED storeVars
    ELSE /\ Scrub(s)
         /\ UNCHANGED <<backlog, faults>>

(***************************************************************************)
(* SampleRefQueue._retire: s settles as `outcome` (acked or dead).  The    *)
(* settlement always stands: s is in the dedup window and never delivered  *)
(* again (a kept dead letter: until RequeueDeadLetter).  Then the store    *)
(* scrubs s; if that call fails (`fault`), s stays resident and joins the  *)
(* backlog that RetryScrub works off.  KeepDead: a dead letter is not      *)
(* scrubbed, its bytes stay retained (`kept`; the code's byte cap is not   *)
(* modelled: a dead letter over it is one without KeepDead).               *)
(* BugScrubFailUnsettles: a failed scrub during ack leaves s unknown to    *)
(* the queue (not in the window, not in the backlog): the reference bug.   *)
(***************************************************************************)
Retire(s, outcome, fault) ==
    /\ status' = [status EXCEPT ![s] = outcome]
    /\ IF outcome = "dead" /\ KeepDead
       THEN /\ ~fault  \* no store call is made
            /\ window' = Remember(s)
            /\ kept' = kept \cup {s}
            /\ UNCHANGED <<storeVars, backlog, faults>>
       ELSE /\ UNCHANGED kept
            /\ IF fault /\ BugScrubFailUnsettles /\ outcome = "acked"
               THEN /\ Fault
                    /\ UNCHANGED <<storeVars, window, backlog>>
               ELSE /\ window' = Remember(s)
                    /\ ScrubOrOwe(s, fault)

(* s's lease history becomes l and s is dead-lettered (its bytes scrubbed, owed or kept). *)
DeadLetter(s, l, fault) ==
    /\ lease' = l
    /\ Retire(s, "dead", fault)
    /\ UNCHANGED <<queue, deliveries>>

(* SampleRefQueue._redeliver: to the tail as a new lease, or dead once deliveries are spent. *)
Redeliver(s, l, fault) ==
    LET next == deliveries[s] + 1 IN
    IF next >= MaxDeliveries /\ ~BugNoDeliveryLimit
    THEN DeadLetter(s, l, fault)
    ELSE /\ ~fault
         /\ status' = [status EXCEPT ![s] = "pending"]
         /\ deliveries' = [deliveries EXCEPT ![s] = next]
         /\ lease' = [l EXCEPT ![s][next] = "pending"]
         /\ queue' = Append(queue, s)
         /\ UNCHANGED <<storeVars, faultVars>>

(* SampleRefQueue._maybe_drained, which the code calls at the end of close and of every settle. *)
DrainIfIdle ==
    lifecycle' = IF lifecycle = "draining" /\ QueueEmptyAfter THEN "drained" ELSE lifecycle

-----------------------------------------------------------------------------
(* The queue's actions.  Each XxxCore leaves the producers' variables and  *)
(* the lifecycle to its callers: the producer actions and the XxxStep      *)
(* actions of Next below, and the single-step operators (Put, Ack, ...)    *)
(* that trace validation matches recorded events against.                  *)

(* SampleRefQueue.put: enqueue a stored sample; the store retains it. *)
PutCore(s) ==
    /\ status[s] = "stored"
    /\ lifecycle = "open"
    /\ status' = [status EXCEPT ![s] = "pending"]
    /\ deliveries' = [deliveries EXCEPT ![s] = 0]
    /\ lease' = [lease EXCEPT ![s][0] = "pending"]
    /\ queue' = Append(queue, s)
    /\ retained' = retained \cup ({s} \cap resident)
    /\ UNCHANGED <<held, handles, hcount, resident, residentBytes, bp, lifecycle, faultVars>>

(* SampleRefQueue.acquire -> _lease_head: lease the FIFO head to consumer c. *)
Acquire(c) ==
    /\ queue # <<>>
    /\ Cardinality(held[c]) < MaxHeld
    /\ LET s == Head(queue)
           k == deliveries[s]
       IN /\ CanFire("Acquire", s, k)
          /\ lease' = Fired("Acquire", s, k)
          /\ status' = [status EXCEPT ![s] = "leased"]
          /\ queue' = Tail(queue)
          /\ held' = [held EXCEPT ![c] = @ \cup {<<s, k>>}]
    /\ UNCHANGED <<deliveries, handles, storeVars, bp, lifecycle, faultVars, envVars>>

(* SampleRefQueue.ack: settle the live lease (the store scrubs the sample); a stale lease is rejected. *)
AckCore(c, t, fault) ==
    LET s == t[1]
        k == t[2]
    IN /\ t \in held[c]
       /\ s \notin lost  \* its get raises SampleLostError: the consumer reports it (LoseCore), never acks it
       /\ s \notin Untrainable  \* the loader refuses its ref before training: it rejects it (RejectCore)
       /\ held' = [held EXCEPT ![c] = @ \ {t}]
       /\ IF CanFire("Ack", s, k)
          THEN /\ lease' = Fired("Ack", s, k)
               /\ Retire(s, "acked", fault)
               /\ UNCHANGED <<queue, deliveries>>
          ELSE /\ ~fault
               /\ UNCHANGED <<status, queue, deliveries, lease, storeVars, faultVars>>
       /\ UNCHANGED <<handles, bp>>

(* SampleRefQueue.fail: give the live lease back (redeliver or dead-letter); a stale lease is rejected. *)
FailCore(c, t, fault) ==
    LET s == t[1]
        k == t[2]
    IN /\ t \in held[c]
       /\ s \notin lost  \* (as for AckCore)
       /\ held' = [held EXCEPT ![c] = @ \ {t}]
       /\ IF CanFire("Fail", s, k)
          THEN Redeliver(s, Fired("Fail", s, k), fault)
          ELSE /\ ~fault
               /\ UNCHANGED <<status, queue, deliveries, lease, storeVars, faultVars>>
       /\ UNCHANGED <<handles, bp>>

(***************************************************************************)
(* Lost bytes.  StoreLoses: the store loses a queued sample's bytes -- the *)
(* process whose Mooncake segment held them died, the master restarted    *)
(* without them -- a fault of the world, not of a store call (at most      *)
(* MaxLosses per behaviour; model bound: while no consumer reads it).      *)
(* LoseCore: the consumer whose get found the bytes gone calls             *)
(* LeaseQueue.lose: the live lease is failed and the sample dead-lettered  *)
(* at once (reason "lost"), whatever deliveries are left; its scrub finds  *)
(* nothing left to free.  A stale lease changes nothing.                   *)
(* BugLostRedelivered: the consumer fails it like any other error, so the  *)
(* queue redelivers bytes no redelivery can serve.                         *)
(***************************************************************************)
StoreLoses(s) ==
    /\ Cardinality(lost) < MaxLosses
    /\ s \in resident /\ status[s] \in HeldByQueue
    /\ \A c \in Consumers : s \notin handles[c]
    /\ lost' = lost \cup {s}
    /\ Free(s)
    /\ UNCHANGED <<status, queue, deliveries, lease, held, handles, bp, lifecycle, faultVars, pc, owns, givenBack>>

LoseCore(c, t) ==
    LET s == t[1]
        k == t[2]
    IN /\ t \in held[c]
       /\ s \in lost
       /\ held' = [held EXCEPT ![c] = @ \ {t}]
       /\ IF CanFire("Fail", s, k)
          THEN IF BugLostRedelivered
               THEN Redeliver(s, Fired("Fail", s, k), FALSE)
               ELSE /\ lease' = Fired("Fail", s, k)
                    /\ status' = [status EXCEPT ![s] = "dead"]
                    /\ window' = Remember(s)
                    /\ UNCHANGED <<queue, deliveries, storeVars, backlog, faults, kept>>
          ELSE UNCHANGED <<status, queue, deliveries, lease, storeVars, faultVars>>
       /\ UNCHANGED <<handles, bp>>

(***************************************************************************)
(* LeaseQueue.reject: the loader's schema refuses s's ref (Untrainable: a *)
(* dtype, rank or token count no consumer can train), so it dead-letters  *)
(* the live lease at once (reason "schema"), whatever deliveries are left: *)
(* the Fail edge into Redeliver's dead-letter branch, the bytes scrubbed  *)
(* (a failing scrub owed) or kept as any dead letter's.  It differs from  *)
(* LoseCore, whose sample has no bytes left to scrub or keep.  A stale    *)
(* lease changes nothing.  BugUntrainedAcked: the reject acks the sample, *)
(* so it is counted as trained (AckedWasTrained fails).                   *)
(***************************************************************************)
RejectCore(c, t, fault) ==
    LET s == t[1]
        k == t[2]
    IN /\ t \in held[c]
       /\ s \in Untrainable
       /\ held' = [held EXCEPT ![c] = @ \ {t}]
       /\ IF CanFire("Fail", s, k)
          THEN IF BugUntrainedAcked
               THEN /\ lease' = Fired("Ack", s, k)
                    /\ Retire(s, "acked", fault)
                    /\ UNCHANGED <<queue, deliveries>>
               ELSE DeadLetter(s, Fired("Fail", s, k), fault)
          ELSE /\ ~fault
               /\ UNCHANGED <<status, queue, deliveries, lease, storeVars, faultVars>>
       /\ UNCHANGED <<handles, bp>>
(* LeaseQueue.give_back: a consumer hands back a lease it never used (the  *)
(* loader's prefetched leases on close).  The delivery did not happen: the *)
(* same attempt goes back to pending at the tail, its redelivery count     *)
(* unchanged, so it spends none of MaxDeliveries.  A stale lease changes   *)
(* nothing.  GiveBackStep bounds the give-backs of a behaviour             *)
(* (MaxGiveBacks: each loader gives back once, when it closes, and a run   *)
(* closes finitely many loaders), so a sample cannot be given back for     *)
(* ever and EventuallySettled still holds.                                 *)
(***************************************************************************)
GiveBackCore(c, t) ==
    LET s == t[1]
        k == t[2]
    IN /\ t \in held[c]
       /\ held' = [held EXCEPT ![c] = @ \ {t}]
       /\ IF CanFire("GiveBack", s, k)
          THEN /\ lease' = Fired("GiveBack", s, k)
               /\ status' = [status EXCEPT ![s] = "pending"]
               /\ queue' = Append(queue, s)
          ELSE UNCHANGED <<status, queue, lease>>
       /\ UNCHANGED <<deliveries, handles, storeVars, bp, faultVars>>

GiveBackStep(c, t) ==
    /\ givenBack < MaxGiveBacks
    /\ givenBack' = givenBack + 1
    /\ GiveBackCore(c, t)
    /\ UNCHANGED <<lifecycle, pc, owns, lost>>

(* SampleRefQueue._reap_due (every call) / reclaim_expired / the reaper thread: the live lease of s *)
(* passed its deadline and is reclaimed.  BugNoReaper: nothing ever does this.                     *)
ReclaimCore(s, fault) ==
    /\ ~BugNoReaper
    /\ status[s] = "leased"
    /\ CanFire("Reclaim", s, deliveries[s])
    /\ Redeliver(s, Fired("Reclaim", s, deliveries[s]), fault)
    /\ UNCHANGED <<held, handles, bp>>

(* SampleRefQueue.extend: a live lease's deadline moves (time is abstract: no variable changes); *)
(* a stale lease raises LeaseLost and changes nothing either.                                      *)
Extend(c, t) ==
    /\ t \in held[c]
    /\ \/ CanFire("Extend", t[1], t[2]) /\ lease' = Fired("Extend", t[1], t[2])
       \/ ~CanFire("Extend", t[1], t[2]) /\ UNCHANGED lease
    /\ UNCHANGED <<status, queue, deliveries, held, handles, storeVars, bp, lifecycle, faultVars, envVars>>

(* FeatureStore.get by a consumer holding a (possibly stale) lease of s. *)
Get(c, s) ==
    /\ s \in resident
    /\ s \notin handles[c]
    /\ \E k \in Attempts : <<s, k>> \in held[c]
    /\ handles' = [handles EXCEPT ![c] = @ \cup {s}]
    /\ hcount' = [hcount EXCEPT ![s] = @ + 1]
    /\ UNCHANGED <<status, queue, deliveries, lease, held, resident, retained, residentBytes, bp, lifecycle,
                   faultVars, envVars>>

(* FeatureStore.release: the last handle frees a sample no queue retains; a scrubbed sample's *)
(* handle is a no-op.  BugStaleRelease frees it even while the queue retains it.              *)
Release(c, s) ==
    /\ s \in handles[c]
    /\ handles' = [handles EXCEPT ![c] = @ \ {s}]
    /\ IF s \notin resident \/ hcount[s] = 0
       THEN UNCHANGED storeVars
       ELSE IF hcount[s] = 1 /\ (s \notin retained \/ BugStaleRelease)
            THEN Free(s)
            ELSE /\ hcount' = [hcount EXCEPT ![s] = @ - 1]
                 /\ UNCHANGED <<resident, retained, residentBytes>>
    /\ UNCHANGED <<status, queue, deliveries, lease, held, bp, lifecycle, faultVars, envVars>>

(* A consumer process dies: it forgets its leases and handles; the store still counts the handles. *)
Crash(c) ==
    /\ held[c] \cup handles[c] # {}
    /\ held' = [held EXCEPT ![c] = {}]
    /\ handles' = [handles EXCEPT ![c] = {}]
    /\ UNCHANGED <<status, queue, deliveries, lease, storeVars, bp, lifecycle, faultVars, envVars>>

(* The store holds as many samples as its count cap allows: its next put raises MemoryError.  The *)
(* backpressure reads it from StoreHealth (sample_count, sample_capacity); BugOnlyBytes ignores it.  *)
AtSampleCap == ~BugOnlyBytes /\ Cardinality(resident) >= MaxSamples

(* SampleRefQueue._update_backpressure, evaluated on a fresh store.health():        *)
(* pause at/above the high watermark or at the sample-count cap, resume at/below    *)
(* the low watermark once below the cap, keep the state inside the band.           *)
(* (on_pause / on_resume run after each, outside the lock.)                         *)
Pause ==
    /\ bp = "flowing" /\ (residentBytes >= HighWatermark \/ AtSampleCap)
    /\ bp' = "paused"
    /\ UNCHANGED <<status, queue, deliveries, lease, held, handles, storeVars, lifecycle, faultVars, envVars>>

Resume ==
    /\ bp = "paused" /\ residentBytes <= LowWatermark /\ ~AtSampleCap
    /\ bp' = "flowing"
    /\ UNCHANGED <<status, queue, deliveries, lease, held, handles, storeVars, lifecycle, faultVars, envVars>>

(* The scrub backlog: a later queue operation (or FeatureStore.gc's sweep) retries the store call  *)
(* that failed -- scrub for a settled sample, unretain for a refused put -- until it succeeds.    *)
(* A retry that fails again changes nothing but the fault count (this is also "gc fails").        *)
RetryScrub(s, fault) ==
    /\ s \in backlog
    /\ IF fault
       THEN /\ Fault
            /\ UNCHANGED <<storeVars, window, backlog, kept>>
       ELSE /\ backlog' = backlog \ {s}
            /\ IF status[s] \in Terminal \cup {"discarded"}
               THEN Free(s)
               ELSE /\ retained' = retained \ {s}
                    /\ UNCHANGED <<resident, hcount, residentBytes>>
            /\ UNCHANGED <<window, faults, kept>>
    /\ UNCHANGED <<status, queue, deliveries, lease, held, handles, bp, lifecycle, envVars>>

-----------------------------------------------------------------------------
(***************************************************************************)
(* Producers.  A producer stores a sample (FeatureStore.put), then calls   *)
(* put_blocks_until_below.  Each round of its loop, under the queue lock:  *)
(* a closed queue raises; store.health() is read (it may fail: the put     *)
(* raises); the hysteresis is applied (Pause / Resume: the callback runs  *)
(* and the producer polls again); once it has settled, the producer       *)
(* enqueues if the queue is flowing below the high watermark -- or, THE   *)
(* FIX, if it is paused and holds nothing at all (nothing pending or       *)
(* leased: then nothing the queue does can lower residency, so waiting     *)
(* could last for ever).  Otherwise it waits for an ack/scrub or its poll  *)
(* interval;                                                               *)
(* abort_when() may end the wait.  Whenever its put raises or aborts, the  *)
(* producer discards the sample (evicts it from the store) and goes on     *)
(* with a new one: it does not retry the same id.                          *)
(***************************************************************************)

(* The producer's decision once the round's hysteresis has settled (a round that pauses or resumes  *)
(* runs the callback and polls again): flowing below the high watermark -- or, the fix, paused with  *)
(* nothing pending or leased.                                                                         *)
MayEnqueue ==
    \/ bp = "flowing" /\ residentBytes < HighWatermark /\ ~AtSampleCap
    \/ bp = "paused" /\ (residentBytes > LowWatermark \/ AtSampleCap) /\ ~BugProducerBytesCounted /\ QueueEmpty

(* An id a producer may store: a fresh one, or a settled one the queue has forgotten (evicted from *)
(* the dedup window, its bytes gone).  Model bound: no consumer still holds a lease or handle of   *)
(* the old incarnation (the code's lease ids are unique; the model's <<s, attempt>> names are not). *)
Storable(s) ==
    \/ status[s] = "absent"
    \/ /\ status[s] \in Terminal /\ ~KnownSettled(s) /\ s \notin resident
       /\ \A c \in Consumers : s \notin handles[c] /\ \A k \in Attempts : <<s, k>> \notin held[c]

(* FeatureStore.put, then the producer enters put_blocks_until_below.  (A store after close is the *)
(* same as a store just before it, whose put then raises: ClosedRaise.)  A store at its count cap  *)
(* refuses the put (MemoryError): SampleCapRoom checks a producer is never left to that.           *)
ProducerStore(p, s) ==
    /\ pc[p] = "idle" /\ lifecycle = "open"
    /\ Cardinality(resident) < MaxSamples
    /\ Storable(s)
    /\ status' = [status EXCEPT ![s] = "stored"]
    /\ deliveries' = [deliveries EXCEPT ![s] = 0]
    /\ lease' = [lease EXCEPT ![s] = [k \in Attempts |-> NoLease]]
    /\ resident' = resident \cup {s}
    /\ residentBytes' = residentBytes + SampleSize(s)
    /\ pc' = [pc EXCEPT ![p] = "waiting"]
    /\ owns' = [owns EXCEPT ![p] = s]
    /\ lost' = lost \ {s}  \* a new incarnation: bytes of its own
    /\ UNCHANGED <<queue, held, handles, hcount, retained, bp, lifecycle, faultVars, givenBack>>

Waiting(p) == pc[p] = "waiting" /\ lifecycle = "open"

(* The hysteresis step of a waiting producer's round (store.health() succeeded). *)
PauseP(p) == Waiting(p) /\ Pause
ResumeP(p) == Waiting(p) /\ Resume

(* The round ends in the enqueue: retain succeeds, the sample is pending. *)
Enqueue(p) ==
    /\ Waiting(p)
    /\ MayEnqueue
    /\ PutCore(owns[p])
    /\ pc' = [pc EXCEPT ![p] = "idle"]
    /\ owns' = [owns EXCEPT ![p] = NoSample]
    /\ UNCHANGED <<lost, givenBack>>

(* ... or store.retain fails: the put is refused and raises; queue and store are unchanged. *)
RetainFails(p) ==
    /\ Waiting(p)
    /\ MayEnqueue
    /\ Fault
    /\ pc' = [pc EXCEPT ![p] = "aborted"]
    /\ UNCHANGED <<status, queue, deliveries, lease, held, handles, storeVars, bp, lifecycle, window, backlog, kept,
                   owns, lost, givenBack>>

(* store.health() fails: the put raises (the producer treats it as an abort and discards). *)
HealthFails(p) ==
    /\ Waiting(p)
    /\ Fault
    /\ pc' = [pc EXCEPT ![p] = "aborted"]
    /\ UNCHANGED <<status, queue, deliveries, lease, held, handles, storeVars, bp, lifecycle, window, backlog, kept,
                   owns, lost, givenBack>>

(* abort_when() returned True: the put raises. *)
Abort(p) ==
    /\ pc[p] = "waiting"
    /\ pc' = [pc EXCEPT ![p] = "aborted"]
    /\ UNCHANGED <<status, queue, deliveries, lease, held, handles, storeVars, bp, lifecycle, faultVars, owns, lost, givenBack>>

(***************************************************************************)
(* close() wakes every waiting producer and its put raises.  A put whose    *)
(* retain succeeded before the close was seen (the Redis backend retains   *)
(* outside its lock) is refused after it: the queue calls store.unretain.  *)
(* If that fails (`fault`) the sample stays retained but not queued; the   *)
(* queue keeps it in the backlog and RetryScrub retries the unretain.      *)
(***************************************************************************)
ClosedRaise(p, fault) ==
    /\ pc[p] = "waiting" /\ lifecycle # "open"
    /\ pc' = [pc EXCEPT ![p] = "aborted"]
    /\ IF fault
       THEN /\ Fault
            /\ retained' = retained \cup {owns[p]}
            /\ backlog' = backlog \cup {owns[p]}
       ELSE UNCHANGED <<retained, backlog, faults>>
    /\ UNCHANGED <<status, queue, deliveries, lease, held, handles, resident, hcount, residentBytes, bp, lifecycle,
                   window, kept, owns, lost, givenBack>>

(* The producer evicts the sample whose put raised or aborted (FeatureProducer.discard -> store.scrub: *)
(* the bytes go at once, even while a failed unretain of it is in the backlog; that retry then finds   *)
(* nothing left to do).                                                                                *)
Discard(p) ==
    LET s == owns[p] IN
    /\ pc[p] = "aborted"
    /\ status' = [status EXCEPT ![s] = "discarded"]
    /\ Free(s)
    /\ pc' = [pc EXCEPT ![p] = "idle"]
    /\ owns' = [owns EXCEPT ![p] = NoSample]
    /\ UNCHANGED <<queue, deliveries, lease, held, handles, bp, lifecycle, faultVars, lost, givenBack>>

(* SampleRefQueue.put of an id the queue still knows is settled: refused by dedup (DedupRefused).  *)
(* The queue accepts an id it does not know; in this spec that happens only through a bug (with    *)
(* the fix, an unknown settled id has no bytes left, and a producer stores it anew: ProducerStore). *)
Reput(s) ==
    /\ status[s] \in Terminal
    /\ lifecycle = "open"
    /\ IF KnownSettled(s) /\ ~BugNoDedup
       THEN UNCHANGED vars
       ELSE /\ BugNoDedup \/ s \in resident
            /\ status' = [status EXCEPT ![s] = "pending"]
            /\ deliveries' = [deliveries EXCEPT ![s] = 0]
            /\ lease' = [lease EXCEPT ![s] = [k \in Attempts |-> IF k = 0 THEN "pending" ELSE NoLease]]
            /\ queue' = Append(queue, s)
            /\ resident' = resident \cup {s}
            /\ retained' = retained \cup {s}
            /\ residentBytes' = residentBytes + (IF s \in resident THEN 0 ELSE SampleSize(s))
            /\ UNCHANGED <<held, handles, hcount, bp, lifecycle, faultVars, envVars>>

-----------------------------------------------------------------------------
(***************************************************************************)
(* Dead-letter repair (SampleRefQueue(keep_dead_letter_bytes=...)).        *)
(* requeue_dead_letters: a dead letter whose bytes were kept goes back to  *)
(* the pending tail as a fresh sample -- delivery budget reset, a new      *)
(* lease history, its id out of the dedup window and no longer kept.  It   *)
(* was never acked (ExactlyOnce).  The code refuses a dead letter whose    *)
(* bytes are gone (not kept) and a drained queue.                          *)
(* BugRequeueAnySettled: any settled id is requeued, acked or bytes gone.  *)
(***************************************************************************)
Requeueable(s) == IF BugRequeueAnySettled THEN status[s] \in Terminal ELSE s \in kept

RequeueCore(s) ==
    /\ Requeueable(s)
    /\ lifecycle # "drained"
    /\ status' = [status EXCEPT ![s] = "pending"]
    /\ deliveries' = [deliveries EXCEPT ![s] = 0]
    /\ lease' = [lease EXCEPT ![s] = [k \in Attempts |-> IF k = 0 THEN "pending" ELSE NoLease]]
    /\ queue' = Append(queue, s)
    /\ window' = SelectSeq(window, LAMBDA x : x # s)
    /\ kept' = kept \ {s}
    /\ UNCHANGED <<held, handles, storeVars, bp, lifecycle, backlog, faults, envVars>>

(* In Next, model bounds: only while the queue is open (a requeue while draining is what trace      *)
(* validation admits; in Next it would let an operator postpone the drain for ever); no consumer    *)
(* still holds a lease of the old incarnation (the code's lease ids are unique; <<s, attempt>> is  *)
(* not); and the store counts no handle of s (else crashed consumers' handles, which the store     *)
(* keeps counting, would pile up over endless requeues: an infinite model).                        *)
RequeueStep(s) ==
    /\ lifecycle = "open"
    /\ hcount[s] = 0
    /\ \A c \in Consumers, k \in Attempts : <<s, k>> \notin held[c]
    /\ RequeueCore(s)

(* purge_dead_letters: a dead letter dropped for good; kept bytes are scrubbed (a failing scrub is   *)
(* owed, as after an ack).  The id stays in the dedup window.  Purging a dead letter whose bytes    *)
(* are gone changes no spec variable (the spec does not model the dead-letter list).                *)
PurgeDeadLetter(s, fault) ==
    /\ s \in kept
    /\ kept' = kept \ {s}
    /\ ScrubOrOwe(s, fault)
    /\ UNCHANGED <<status, queue, deliveries, lease, held, handles, bp, lifecycle, window, envVars>>

-----------------------------------------------------------------------------
(* Steps of Next: the queue's settling actions end with _maybe_drained, as the code does. *)

AckStep(c, t, fault) == AckCore(c, t, fault) /\ DrainIfIdle /\ UNCHANGED envVars
FailStep(c, t, fault) == FailCore(c, t, fault) /\ DrainIfIdle /\ UNCHANGED envVars
LoseStep(c, t) == LoseCore(c, t) /\ DrainIfIdle /\ UNCHANGED envVars
RejectStep(c, t, fault) == RejectCore(c, t, fault) /\ DrainIfIdle /\ UNCHANGED envVars
ReclaimStep(s, fault) == ReclaimCore(s, fault) /\ DrainIfIdle /\ UNCHANGED envVars

(* SampleRefQueue.close: refuse further puts, wake blocked producers; drained at once if it holds nothing. *)
CloseStep ==
    /\ lifecycle = "open"
    /\ lifecycle' = IF QueueEmpty THEN "drained" ELSE "draining"
    /\ UNCHANGED <<status, queue, deliveries, lease, held, handles, storeVars, bp, faultVars, envVars>>

(* The end of a run: drained, every producer finished, the scrub backlog worked off. *)
Finished == lifecycle = "drained" /\ backlog = {} /\ \A p \in Producers : pc[p] = "idle"
Done == Finished /\ UNCHANGED vars

Settle(c) == \E t \in held[c] : LoseStep(c, t) \/ \E f \in BOOLEAN : AckStep(c, t, f) \/ FailStep(c, t, f) \/ RejectStep(c, t, f)

Next ==
    \/ \E p \in Producers :
          \/ \E s \in Samples : ProducerStore(p, s)
          \/ PauseP(p) \/ ResumeP(p) \/ Enqueue(p) \/ RetainFails(p) \/ HealthFails(p) \/ Abort(p)
          \/ \E f \in BOOLEAN : ClosedRaise(p, f)
          \/ Discard(p)
    \/ \E s \in Samples : Reput(s) \/ \E f \in BOOLEAN : ReclaimStep(s, f) \/ RetryScrub(s, f)
    \/ \E s \in Samples : RequeueStep(s) \/ \E f \in BOOLEAN : PurgeDeadLetter(s, f)
    \/ \E s \in Samples : StoreLoses(s)
    \/ \E c \in Consumers : Acquire(c) \/ Crash(c) \/ \E t \in held[c] : Extend(c, t) \/ GiveBackStep(c, t)
    \/ \E c \in Consumers : Settle(c)
    \/ \E c \in Consumers, s \in Samples : Get(c, s) \/ Release(c, s)
    \/ CloseStep
    \/ Done

Spec == Init /\ [][Next]_vars

(***************************************************************************)
(* Fairness (the assumptions the liveness properties rest on):             *)
(* - consumers: an idle consumer eventually acquires (WF), and a consumer  *)
(*   eventually acks or fails what it holds -- or has crashed (WF Settle); *)
(* - time passes and the reaper runs: a live lease is eventually reclaimed *)
(*   unless settled first (WF Reclaim);                                    *)
(* - a waiting producer keeps polling: it applies the hysteresis (WF Pause *)
(*   and Resume), and it takes the enqueue if the enqueue is enabled again *)
(*   and again (STRONG fairness: the enqueue is only intermittently        *)
(*   enabled -- the queue empties and refills, the state flips);           *)
(* - close() wakes waiting producers (WF ClosedRaise), a producer whose    *)
(*   put raised discards its sample (WF Discard);                          *)
(* - the scrub backlog is retried and, once faults have cleared (at most   *)
(*   MaxFaults of them), the retry succeeds (WF on the successful retry).  *)
(* No fairness: storing samples, abort_when, store faults, close itself.   *)
(***************************************************************************)
FairSpec ==
    /\ Spec
    /\ \A c \in Consumers : WF_vars(Acquire(c)) /\ WF_vars(Settle(c))
    /\ \A s \in Samples : WF_vars(\E f \in BOOLEAN : ReclaimStep(s, f)) /\ WF_vars(RetryScrub(s, FALSE))
    /\ \A p \in Producers : /\ SF_vars(Enqueue(p))
                            /\ WF_vars(PauseP(p)) /\ WF_vars(ResumeP(p))
                            /\ WF_vars(\E f \in BOOLEAN : ClosedRaise(p, f)) /\ WF_vars(Discard(p))

(* The same with only WEAK fairness on the enqueue: not enough.  With three ids and a dedup window of *)
(* one, a producer can be starved for ever -- whenever the queue empties, the other producer enqueues *)
(* first -- so ProducerProgress fails (mutants/WeakEnqueueFairness.cfg).                              *)
WeakFairSpec ==
    /\ Spec
    /\ \A c \in Consumers : WF_vars(Acquire(c)) /\ WF_vars(Settle(c))
    /\ \A s \in Samples : WF_vars(\E f \in BOOLEAN : ReclaimStep(s, f)) /\ WF_vars(RetryScrub(s, FALSE))
    /\ \A p \in Producers : /\ WF_vars(Enqueue(p))
                            /\ WF_vars(PauseP(p)) /\ WF_vars(ResumeP(p))
                            /\ WF_vars(\E f \in BOOLEAN : ClosedRaise(p, f)) /\ WF_vars(Discard(p))

-----------------------------------------------------------------------------
(* Single-step queue actions without producers or faults, for trace validation             *)
(* (featurestream.spec.trace matches each recorded event against one of these; the queue  *)
(* records Drain as an event of its own).                                                   *)
StorePut(s) ==
    /\ status[s] = "absent"
    /\ status' = [status EXCEPT ![s] = "stored"]
    /\ resident' = resident \cup {s}
    /\ residentBytes' = residentBytes + SampleSize(s)
    /\ UNCHANGED <<queue, deliveries, lease, held, handles, hcount, retained, bp, lifecycle, faultVars, envVars>>
Put(s) == PutCore(s) /\ UNCHANGED envVars
Ack(c, t) == AckCore(c, t, FALSE) /\ UNCHANGED <<lifecycle, envVars>>
Fail(c, t) == FailCore(c, t, FALSE) /\ UNCHANGED <<lifecycle, envVars>>
Reject(c, t) == RejectCore(c, t, FALSE) /\ UNCHANGED <<lifecycle, envVars>>
GiveBack(c, t) == GiveBackCore(c, t) /\ UNCHANGED <<lifecycle, envVars>>
Reclaim(s) == ReclaimCore(s, FALSE) /\ UNCHANGED <<lifecycle, envVars>>
Close ==
    /\ lifecycle = "open"
    /\ lifecycle' = "draining"
    /\ UNCHANGED <<status, queue, deliveries, lease, held, handles, storeVars, bp, faultVars, envVars>>
RequeueDeadLetter(s) == RequeueCore(s)
(* A purge of a dead letter whose bytes are gone changes no spec variable. *)
PurgeDead(s, fault) ==
    \/ PurgeDeadLetter(s, fault)
    \/ ~fault /\ status[s] = "dead" /\ s \notin kept /\ UNCHANGED vars
Drain ==
    /\ lifecycle = "draining" /\ QueueEmpty
    /\ lifecycle' = "drained"
    /\ UNCHANGED <<status, queue, deliveries, lease, held, handles, storeVars, bp, faultVars, envVars>>

-----------------------------------------------------------------------------
(* The invariants of docs/design.md, by number. *)

(* 1. At most one live lease per sample; leased iff it has one, pending iff queued once with a pending lease. *)
OneLiveLease == \A s \in Samples :
    /\ Cardinality({k \in Attempts : lease[s][k] = "leased"}) <= 1
    /\ (status[s] = "leased") <=> (\E k \in Attempts : lease[s][k] = "leased")
    /\ (status[s] = "pending") <=> /\ Cardinality({i \in 1..Len(queue) : queue[i] = s}) = 1
                                  /\ Cardinality({k \in Attempts : lease[s][k] = "pending"}) = 1

(* 2. Exactly-once: an acked sample stays acked -- never delivered or acked again, whatever re-puts and *)
(* store faults -- until its id has left the dedup window and its bytes the store; a producer may then *)
(* store the id anew (the window's documented limit).                                                  *)
ExactlyOnce == [][\A s \in Samples :
    status[s] = "acked" => status'[s] = "acked" \/ (~KnownSettled(s) /\ status'[s] = "stored")]_vars

(* A new incarnation of s starts in this step: a producer stores a forgotten id anew, or a kept dead *)
(* letter is requeued.                                                                              *)
Reborn(s) == status'[s] = "stored" \/ (s \in kept /\ status'[s] = "pending")

(* 12. Settled for good: the same for dead letters, whatever the store does after the settlement -- *)
(* unless a dead letter whose bytes were kept is requeued ...                                      *)
SettledForGood == [][\A s \in Samples : status[s] \in Terminal =>
    \/ status'[s] = status[s]
    \/ ~KnownSettled(s) /\ status'[s] = "stored"
    \/ s \in kept /\ status'[s] = "pending"]_vars

(* ... and a settled id stays known to the queue (dedup window, backlog or kept) while its bytes are in the store. *)
SettledKnown == \A s \in Samples : status[s] \in Terminal /\ s \in resident => KnownSettled(s)

(* 3. Stale-ack rejection: terminal lease states never change (a new incarnation of a forgotten id *)
(* starts a fresh lease history) ...                                                                *)
StaleAckRejection == [][\A s \in Samples, k \in Attempts :
    lease[s][k] \in LeaseStates \ {"pending", "leased"} /\ ~Reborn(s) => lease'[s][k] = lease[s][k]]_vars

(* ... and every lease-state change is an edge of the lease machine. *)
LeaseStepsFollowMachine == [][\A s \in Samples, k \in Attempts :
    (lease[s][k] # NoLease /\ lease'[s][k] # lease[s][k] /\ ~Reborn(s)) =>
        \E t \in LeaseTransitions : t[2] = lease[s][k] /\ t[3] = lease'[s][k]]_vars

(* 7b. A give-back is no delivery: the lease an unused give-back returns to pending keeps its redelivery count. *)
GiveBackUncounted == [][\A s \in Samples, k \in Attempts :
    lease[s][k] = "leased" /\ lease'[s][k] = "pending" /\ ~Reborn(s) => deliveries'[s] = deliveries[s]]_vars

(* 4. No loss: a pending or leased sample is resident, whatever stale consumers release or crash -- *)
(* unless the store lost its bytes, and then the loss is reported: LostReported.                     *)
NoLoss == \A s \in Samples : status[s] \in HeldByQueue => s \in resident \/ s \in lost

(* 4b. A lost sample is reported, never redelivered: the consumer that finds it lost ends its lease *)
(* in a dead letter (reason "lost"), so a failed lease of a lost sample leaves it dead; and a lost   *)
(* sample is never acked.  (A reclaim still redelivers it: the consumer died before it could tell.) *)
LostReported == [][\A s \in lost, k \in Attempts :
    /\ lease[s][k] = "leased" /\ lease'[s][k] = "failed" => status'[s] = "dead"
    /\ status'[s] # "acked"]_vars

(* 16. Nothing is counted as trained that was not: a sample is acked only by a consumer that trained it, *)
(* so a sample no consumer can train (its ref refused by the loader's schema) is never acked -- it ends  *)
(* a dead letter (RejectCore) or, its bytes gone, a lost one.                                          *)
AckedWasTrained == \A s \in Untrainable : status[s] # "acked"

(* 5. No leak: a settled or discarded sample's bytes have left the store, even with a crashed *)
(* consumer's handle out -- unless its scrub (unretain) failed and is in the retry backlog, or *)
(* it is a dead letter whose bytes are kept (KeepDead) for a requeue.                          *)
NoLeak == \A s \in Samples :
    status[s] \in Terminal \cup {"discarded"} /\ s \notin backlog /\ s \notin kept => s \notin resident

(* 6. Residency is exact and non-negative. *)
ResidencyExact ==
    /\ residentBytes = Bytes(resident)
    /\ residentBytes >= 0
    /\ \A s \in Samples : hcount[s] >= 0

(* 7. Bounded delivery: redelivery_count < max_deliveries. *)
BoundedDelivery == \A s \in Samples : deliveries[s] < MaxDeliveries

(* 8. Backpressure hysteresis: pause only at/above high (or at the count cap), resume only at/below low *)
(* (and below the count cap).                                                                          *)
Hysteresis == [][/\ (bp = "flowing" /\ bp' = "paused") => residentBytes >= HighWatermark \/ AtSampleCap
                 /\ (bp = "paused" /\ bp' = "flowing") => residentBytes <= LowWatermark /\ ~AtSampleCap]_vars

(***************************************************************************)
(* 8/11. The residency bound the backpressure rule guarantees.  A sample   *)
(* is enqueued either while flowing below the high watermark -- its bytes  *)
(* are already resident, so afterwards the queue holds < HighWatermark     *)
(* bytes -- or into an empty queue, which then holds that one sample.      *)
(* Nothing else adds bytes to the queue, so at all times                   *)
(*   QueuedBytes <= QueueBound = Max(HighWatermark - 1, MaxSampleSize)     *)
(* and the store holds no more than that plus what producers hold unqueued *)
(* (stored, not yet enqueued or discarded: at most one sample each) plus   *)
(* the scrub backlog (settled or refused, store call being retried).       *)
(***************************************************************************)
(* KeepDead: kept dead letters' bytes stay resident and count towards the watermarks, and a requeue *)
(* puts them back into the queue without a backpressure check (an operator's action, as a direct  *)
(* SampleRefQueue.put); the queue bound then does not hold, but every resident byte is still      *)
(* accounted for: queued, a producer's, owed (backlog) or kept.                                    *)
QueueBound == Max(HighWatermark - 1, MaxSampleSize)
QueuedBytes == Bytes({s \in Samples : status[s] \in HeldByQueue} \ lost)  \* lost bytes are held by nobody
ProducerBytes == Bytes({s \in Samples : status[s] = "stored"})
ResidencyBound ==
    /\ KeepDead \/ QueuedBytes <= QueueBound
    /\ residentBytes <= (IF KeepDead THEN QueuedBytes ELSE QueueBound) + ProducerBytes + Bytes(backlog) + Bytes(kept)
    /\ Cardinality({s \in Samples : status[s] = "stored"}) <= Cardinality(Producers)
    /\ \A p \in Producers : (pc[p] = "idle") <=> (owns[p] = NoSample)
    /\ \A p \in Producers : pc[p] # "idle" => status[owns[p]] = "stored"

(***************************************************************************)
(* 14. The count cap.  A producer stores its sample before it enters       *)
(* put_blocks_until_below, so the put is let through only below the cap, *)
(* its own sample counted -- or into an empty queue, where nothing the     *)
(* queue does could free a slot: the queue holds fewer than MaxSamples     *)
(* samples (or that one).  So once every producer is between puts, with    *)
(* no scrub owed and no dead letter's bytes kept, the store has room for   *)
(* the next FeatureStore.put: a producer that could have waited never      *)
(* meets MemoryError.  (Slots other producers' unqueued samples, the scrub *)
(* backlog or kept bytes take are outside the queue's reach, as in the     *)
(* residency bound.)  BugOnlyBytes breaks it.                              *)
(***************************************************************************)
QueuedCount == Cardinality({s \in Samples : status[s] \in HeldByQueue})
SampleCapRoom ==
    /\ KeepDead \/ QueuedCount < Max(MaxSamples, 2)
    /\ (MaxSamples >= 2 /\ backlog = {} /\ kept = {} /\ \A p \in Producers : pc[p] = "idle")
           => Cardinality(resident) < MaxSamples

(* 9. Close/drain: drained only when nothing is pending or leased ... *)
CloseDrain == lifecycle = "drained" => QueueEmpty

(* ... after close no put is accepted, and drained is final. *)
ClosedRefusesPuts == [][/\ lifecycle # "open" =>
                            \A s \in Samples : status[s] \notin HeldByQueue => status'[s] \notin HeldByQueue
                        /\ lifecycle = "drained" => lifecycle' = "drained"]_vars

(* 10. Liveness: every enqueued sample is eventually acked or dead-lettered. *)
EventuallySettled == \A s \in Samples : status[s] \in HeldByQueue ~> status[s] \in Terminal

(* 11. Producer progress: a put blocked by backpressure eventually enqueues or raises (abort, close, *)
(* a failed store call) -- for any number of producers, whatever they hold unqueued.                *)
ProducerProgress == \A p \in Producers : pc[p] = "waiting" ~> pc[p] # "waiting"

(* 9/13. A closed queue eventually drains, and once faults have cleared the run finishes: every *)
(* producer done, the backlog worked off, nothing resident but kept dead letters (until purged). *)
EventuallyDrained == lifecycle = "draining" ~> lifecycle = "drained"
DrainAfterFaults == lifecycle # "open" ~> (Finished /\ resident \subseteq kept)
=============================================================================
