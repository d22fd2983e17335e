----------------------------- MODULE LeaseQueue -----------------------------
(***************************************************************************)
(* The featurestream lease / ack / fail queue with its store residency,   *)
(* backpressure and close/drain lifecycle.                                 *)
(*                                                                         *)
(* Every delivery attempt of a sample is one lease, <<sample, attempt>>,  *)
(* that walks the lease machine below (featurestream.machines.LEASE).      *)
(* Time is abstract: any live lease may have passed its deadline, so       *)
(* Reclaim may take it at any moment, and Extend changes no variable.      *)
(* Each action names the method of the code it models.  The Python mirror *)
(* (featurestream/spec/mirror.py) has the same variables and actions; a    *)
(* test checks that its reachable-state count equals TLC's.                *)
(***************************************************************************)
EXTENDS Naturals, Sequences, FiniteSets

\* The lease machine, compared with featurestream.machines.LEASE by a test: keep each on one line.
LeaseStates == {"pending", "leased", "acked", "failed", "reclaimed"}
LeaseTransitions == {<<"Acquire", "pending", "leased">>, <<"Extend", "leased", "leased">>, <<"Ack", "leased", "acked">>, <<"Fail", "leased", "failed">>, <<"Reclaim", "leased", "reclaimed">>}

CONSTANTS
    Samples,            \* sample ids the producer may write
    Consumers,          \* consumer processes
    MaxDeliveries,      \* SampleRefQueue(max_deliveries=...)
    HighWatermark,      \* pause at/above this many resident bytes
    LowWatermark,       \* resume at/below this many resident bytes
    MaxHeld,            \* leases one consumer holds at once (a model bound)
    SampleBytes,        \* every sample's size
    \* Each switch re-enables one defect of the reference (DESIGN.md "Known defects").
    BugStaleRelease,    \* A: the last handle release frees a sample the queue still holds
    BugNoScrub,         \* B: a settled sample is only un-retained, never scrubbed
    BugNoDedup,         \* C: a re-put of a settled id is accepted
    BugNoDeliveryLimit, \* D: no max_deliveries, no dead letter
    BugNoReaper         \* E: nothing ever reclaims an expired lease

ASSUME /\ MaxDeliveries \in Nat \ {0}
       /\ LowWatermark \in Nat /\ HighWatermark \in Nat /\ LowWatermark < HighWatermark
       /\ MaxHeld \in Nat \ {0} /\ SampleBytes \in Nat \ {0}
       /\ \A b \in {BugStaleRelease, BugNoScrub, BugNoDedup, BugNoDeliveryLimit, BugNoReaper} : b \in BOOLEAN

NoLease == "none"            \* an attempt that was never created
Attempts == 0..MaxDeliveries \* one slot past the limit, reachable only with BugNoDeliveryLimit
Statuses == {"absent", "stored", "pending", "leased", "acked", "dead"}
Terminal == {"acked", "dead"}
HeldByQueue == {"pending", "leased"}

Source(name) == (CHOOSE t \in LeaseTransitions : t[1] = name)[2]
Dest(name) == (CHOOSE t \in LeaseTransitions : t[1] = name)[3]

VARIABLES
    status,        \* [Samples -> Statuses]: the queue-level status of each sample
    queue,         \* the pending FIFO (SampleRefQueue._pending), head first
    deliveries,    \* [Samples -> Attempts]: redelivery_count of the sample's current lease
    lease,         \* [Samples -> [Attempts -> LeaseStates \cup {NoLease}]]: every lease ever made
    held,          \* [Consumers -> SUBSET (Samples \X Attempts)]: lease objects a consumer holds
    handles,       \* [Consumers -> SUBSET Samples]: store handles a consumer knows it holds
    hcount,        \* [Samples -> Nat]: handles the store counts (crashed consumers' included)
    resident,      \* samples whose bytes the store holds
    retained,      \* samples a queue holds (FeatureStore.retain ... scrub)
    residentBytes, \* the store's byte counter (StoreHealth.resident_bytes)
    bp,            \* backpressure machine: "flowing" | "paused"
    lifecycle      \* lifecycle machine: "open" | "draining" | "drained"

storeVars == <<resident, retained, hcount, residentBytes>>
vars == <<status, queue, deliveries, lease, held, handles, hcount, resident, retained, residentBytes, bp, lifecycle>>

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

(* The lease machine: attempt k of s may take transition `name` iff it is in its source state. *)
CanFire(name, s, k) == lease[s][k] = Source(name)
Fired(name, s, k) == [lease EXCEPT ![s][k] = Dest(name)]

(* LedgerFeatureStore._forget: the store drops s's bytes and bookkeeping. *)
Free(s) ==
    /\ resident' = resident \ {s}
    /\ retained' = retained \ {s}
    /\ hcount' = [hcount EXCEPT ![s] = 0]
    /\ residentBytes' = residentBytes - (IF s \in resident THEN SampleBytes ELSE 0)

(* SampleRefQueue._retire -> FeatureStore.scrub: free a settled sample whatever handles are out. *)
Scrub(s) ==
    IF BugNoScrub /\ hcount[s] > 0
    THEN /\ retained' = retained \ {s}
         /\ UNCHANGED <<resident, hcount, residentBytes>>
    ELSE Free(s)

(* SampleRefQueue._redeliver: to the tail as a new lease, or dead once deliveries are spent. *)
Redeliver(s, l) ==
    LET next == deliveries[s] + 1 IN
    IF next >= MaxDeliveries /\ ~BugNoDeliveryLimit
    THEN /\ status' = [status EXCEPT ![s] = "dead"]
         /\ lease' = l
         /\ Scrub(s)
         /\ UNCHANGED <<queue, deliveries>>
    ELSE /\ status' = [status EXCEPT ![s] = "pending"]
         /\ deliveries' = [deliveries EXCEPT ![s] = next]
         /\ lease' = [l EXCEPT ![s][next] = "pending"]
         /\ queue' = Append(queue, s)
         /\ UNCHANGED storeVars

-----------------------------------------------------------------------------
(* Producer *)

(* FeatureStore.put: the producer writes a new sample's bytes. *)
StorePut(s) ==
    /\ status[s] = "absent"
    /\ status' = [status EXCEPT ![s] = "stored"]
    /\ resident' = resident \cup {s}
    /\ residentBytes' = residentBytes + SampleBytes
    /\ UNCHANGED <<queue, deliveries, lease, held, handles, hcount, retained, bp, lifecycle>>

(* SampleRefQueue.put / put_blocks_until_below: enqueue a stored sample; the store retains it. *)
Put(s) ==
    /\ status[s] = "stored"
    /\ lifecycle = "open"
    /\ status' = [status EXCEPT ![s] = "pending"]
    /\ deliveries' = [deliveries EXCEPT ![s] = 0]
    /\ lease' = [lease EXCEPT ![s][0] = "pending"]
    /\ queue' = Append(queue, s)
    /\ retained' = retained \cup ({s} \cap resident)
    /\ UNCHANGED <<held, handles, hcount, resident, residentBytes, bp, lifecycle>>

(* SampleRefQueue.put of an id already acked or dead: refused by the dedup window (DedupRefused). *)
Reput(s) ==
    /\ status[s] \in Terminal
    /\ lifecycle = "open"
    /\ IF ~BugNoDedup
       THEN UNCHANGED vars
       ELSE /\ status' = [status EXCEPT ![s] = "pending"]
            /\ deliveries' = [deliveries EXCEPT ![s] = 0]
            /\ lease' = [lease EXCEPT ![s] = [k \in Attempts |-> IF k = 0 THEN "pending" ELSE NoLease]]
            /\ queue' = Append(queue, s)
            /\ resident' = resident \cup {s}
            /\ retained' = retained \cup {s}
            /\ residentBytes' = residentBytes + (IF s \in resident THEN 0 ELSE SampleBytes)
            /\ UNCHANGED <<held, handles, hcount, bp, lifecycle>>

(* SampleRefQueue.put_blocks_until_below -> _update_backpressure: pause at/above the high watermark. *)
Pause ==
    /\ bp = "flowing" /\ residentBytes >= HighWatermark
    /\ bp' = "paused"
    /\ UNCHANGED <<status, queue, deliveries, lease, held, handles, hcount, resident, retained, residentBytes, lifecycle>>

(* ... and resume at/below the low one; inside the band the state is kept. *)
Resume ==
    /\ bp = "paused" /\ residentBytes <= LowWatermark
    /\ bp' = "flowing"
    /\ UNCHANGED <<status, queue, deliveries, lease, held, handles, hcount, resident, retained, residentBytes, lifecycle>>

-----------------------------------------------------------------------------
(* Consumers *)

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
    /\ UNCHANGED <<deliveries, handles, hcount, resident, retained, residentBytes, bp, lifecycle>>

(* SampleRefQueue.ack: settle the live lease (the store scrubs the sample); a stale lease is rejected. *)
Ack(c, t) ==
    LET s == t[1]
        k == t[2]
    IN /\ t \in held[c]
       /\ held' = [held EXCEPT ![c] = @ \ {t}]
       /\ IF CanFire("Ack", s, k)
          THEN /\ lease' = Fired("Ack", s, k)
               /\ status' = [status EXCEPT ![s] = "acked"]
               /\ Scrub(s)
               /\ UNCHANGED <<queue, deliveries>>
          ELSE UNCHANGED <<status, queue, deliveries, lease, hcount, resident, retained, residentBytes>>
       /\ UNCHANGED <<handles, bp, lifecycle>>

(* SampleRefQueue.fail: give the live lease back (redeliver or dead-letter); a stale lease is rejected. *)
Fail(c, t) ==
    LET s == t[1]
        k == t[2]
    IN /\ t \in held[c]
       /\ held' = [held EXCEPT ![c] = @ \ {t}]
       /\ IF CanFire("Fail", s, k)
          THEN Redeliver(s, Fired("Fail", s, k))
          ELSE UNCHANGED <<status, queue, deliveries, lease, hcount, resident, retained, residentBytes>>
       /\ UNCHANGED <<handles, bp, lifecycle>>

(* SampleRefQueue.extend: a live lease's deadline moves (time is abstract: no variable changes); *)
(* a stale lease raises LeaseLost and changes nothing either.                                      *)
Extend(c, t) ==
    /\ t \in held[c]
    /\ \/ CanFire("Extend", t[1], t[2]) /\ lease' = Fired("Extend", t[1], t[2])
       \/ ~CanFire("Extend", t[1], t[2]) /\ UNCHANGED lease
    /\ UNCHANGED <<status, queue, deliveries, held, handles, hcount, resident, retained, residentBytes, bp, lifecycle>>

(* FeatureStore.get by a consumer holding a (possibly stale) lease of s. *)
Get(c, s) ==
    /\ s \in resident
    /\ s \notin handles[c]
    /\ \E k \in Attempts : <<s, k>> \in held[c]
    /\ handles' = [handles EXCEPT ![c] = @ \cup {s}]
    /\ hcount' = [hcount EXCEPT ![s] = @ + 1]
    /\ UNCHANGED <<status, queue, deliveries, lease, held, resident, retained, residentBytes, bp, lifecycle>>

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
    /\ UNCHANGED <<status, queue, deliveries, lease, held, bp, lifecycle>>

(* A consumer process dies: it forgets its leases and handles; the store still counts the handles. *)
Crash(c) ==
    /\ held[c] \cup handles[c] # {}
    /\ held' = [held EXCEPT ![c] = {}]
    /\ handles' = [handles EXCEPT ![c] = {}]
    /\ UNCHANGED <<status, queue, deliveries, lease, hcount, resident, retained, residentBytes, bp, lifecycle>>

-----------------------------------------------------------------------------
(* Time, reaper, lifecycle *)

(* SampleRefQueue._reap_due (every call) / reclaim_expired / the reaper thread: the live lease of s *)
(* passed its deadline and is reclaimed.  BugNoReaper: nothing ever does this.                     *)
Reclaim(s) ==
    /\ ~BugNoReaper
    /\ status[s] = "leased"
    /\ CanFire("Reclaim", s, deliveries[s])
    /\ Redeliver(s, Fired("Reclaim", s, deliveries[s]))
    /\ UNCHANGED <<held, handles, bp, lifecycle>>

(* SampleRefQueue.close: refuse further puts; acquire keeps draining. *)
Close ==
    /\ lifecycle = "open"
    /\ lifecycle' = "draining"
    /\ UNCHANGED <<status, queue, deliveries, lease, held, handles, hcount, resident, retained, residentBytes, bp>>

(* SampleRefQueue._maybe_drained: a closed queue holding nothing pending or leased is drained. *)
Drain ==
    /\ lifecycle = "draining"
    /\ \A s \in Samples : status[s] \notin HeldByQueue
    /\ lifecycle' = "drained"
    /\ UNCHANGED <<status, queue, deliveries, lease, held, handles, hcount, resident, retained, residentBytes, bp>>

Settle(c) == \E t \in held[c] : Ack(c, t) \/ Fail(c, t)

Next ==
    \/ \E s \in Samples : StorePut(s) \/ Put(s) \/ Reput(s) \/ Reclaim(s)
    \/ \E c \in Consumers : Acquire(c) \/ Crash(c) \/ \E t \in held[c] : Ack(c, t) \/ Fail(c, t) \/ Extend(c, t)
    \/ \E c \in Consumers, s \in Samples : Get(c, s) \/ Release(c, s)
    \/ Pause \/ Resume \/ Close \/ Drain

Spec == Init /\ [][Next]_vars

(* Fairness for invariant 10: consumers eventually ack or fail what they hold (or have crashed),  *)
(* idle consumers eventually acquire, time passes and the reaper runs, a closed queue drains.      *)
FairSpec ==
    /\ Spec
    /\ \A c \in Consumers : WF_vars(Acquire(c)) /\ WF_vars(Settle(c))
    /\ \A s \in Samples : WF_vars(Reclaim(s))
    /\ WF_vars(Drain)

-----------------------------------------------------------------------------
(* The invariants of DESIGN.md, by number. *)

(* 1. At most one live lease per sample; leased iff it has one, pending iff queued once with a pending lease. *)
OneLiveLease == \A s \in Samples :
    /\ Cardinality({k \in Attempts : lease[s][k] = "leased"}) <= 1
    /\ (status[s] = "leased") <=> (\E k \in Attempts : lease[s][k] = "leased")
    /\ (status[s] = "pending") <=> /\ Cardinality({i \in 1..Len(queue) : queue[i] = s}) = 1
                                  /\ Cardinality({k \in Attempts : lease[s][k] = "pending"}) = 1

(* 2. Exactly-once: an acked sample stays acked -- never delivered or acked again, whatever re-puts. *)
ExactlyOnce == [][\A s \in Samples : status[s] = "acked" => status'[s] = "acked"]_vars

(* 3. Stale-ack rejection: terminal lease states never change ... *)
StaleAckRejection == [][\A s \in Samples, k \in Attempts :
    lease[s][k] \in LeaseStates \ {"pending", "leased"} => lease'[s][k] = lease[s][k]]_vars

(* ... and every lease-state change is an edge of the lease machine. *)
LeaseStepsFollowMachine == [][\A s \in Samples, k \in Attempts :
    (lease[s][k] # NoLease /\ lease'[s][k] # lease[s][k]) =>
        \E t \in LeaseTransitions : t[2] = lease[s][k] /\ t[3] = lease'[s][k]]_vars

(* 4. No loss: a pending or leased sample is resident, whatever stale consumers release or crash. *)
NoLoss == \A s \in Samples : status[s] \in HeldByQueue => s \in resident

(* 5. No leak: a settled sample's bytes have left the store, even with a crashed consumer's handle out. *)
NoLeak == \A s \in Samples : status[s] \in Terminal => s \notin resident

(* 6. Residency is exact and non-negative. *)
ResidencyExact ==
    /\ residentBytes = Cardinality(resident) * SampleBytes
    /\ residentBytes >= 0
    /\ \A s \in Samples : hcount[s] >= 0

(* 7. Bounded delivery: redelivery_count < max_deliveries. *)
BoundedDelivery == \A s \in Samples : deliveries[s] < MaxDeliveries

(* 8. Backpressure hysteresis: pause only at/above high, resume only at/below low. *)
Hysteresis == [][/\ (bp = "flowing" /\ bp' = "paused") => residentBytes >= HighWatermark
                 /\ (bp = "paused" /\ bp' = "flowing") => residentBytes <= LowWatermark]_vars

(* 9. Close/drain: drained only when nothing is pending or leased ... *)
CloseDrain == lifecycle = "drained" => \A s \in Samples : status[s] \notin HeldByQueue

(* ... after close no put is accepted, and drained is final. *)
ClosedRefusesPuts == [][/\ lifecycle # "open" =>
                            \A s \in Samples : status[s] \in {"absent", "stored"} => status'[s] \in {"absent", "stored"}
                        /\ lifecycle = "drained" => lifecycle' = "drained"]_vars

(* 10. Liveness: every enqueued sample is eventually acked or dead-lettered. *)
EventuallySettled == \A s \in Samples : status[s] \in HeldByQueue ~> status[s] \in Terminal
=============================================================================
