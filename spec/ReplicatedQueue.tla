--------------------------- MODULE ReplicatedQueue ---------------------------
(***************************************************************************)
(* A replicated Redis queue across failovers (docs/redis.md, "Replication  *)
(* and failover"): a primary that applies each call at once and streams    *)
(* its effects to one replica in order, a primary crash that loses what    *)
(* the replica had not received (the replica is promoted with what it      *)
(* has), the old primary restarted as a replica (a full resync), and       *)
(* clients that retry a call whose reply did not come back.                *)
(*                                                                         *)
(* The server's state is a record: each sample's status and live lease,    *)
(* the training ledger's trained flags, and the ids of the calls that took *)
(* effect (the remembered replies and dedup records by which a retry is    *)
(* recognised).  hist holds the states not yet replicated: hist[1] is the  *)
(* replica's, Last(hist) the primary's; replication drops the head.        *)
(*                                                                         *)
(* A producer puts each sample once; a trainer leases a sample, reads the  *)
(* ledger (admission), trains it into its model unless the ledger has it,  *)
(* commits it to the ledger, then acks.  A put, commit or ack returns to   *)
(* its client only once its effect is on the replica (WAIT); a call whose  *)
(* effect a failover took back is retried, and the server either finds it  *)
(* done (its id) or runs it anew.  A lease whose acquire a failover took   *)
(* back, or whose holder moved on, expires and is reclaimed.               *)
(*                                                                         *)
(* Safety: nothing a client was told succeeded is lost; no sample is acked *)
(* effectively twice; the model trains each sample at most once.  TLC runs *)
(* with deadlock checking on: the end of a run is the explicit step Done.  *)
(***************************************************************************)
EXTENDS Integers, Sequences, FiniteSets

CONSTANTS
    Samples,        \* the samples the producer puts
    MaxCrashes,     \* primary crashes (one machine lost at a time; a model bound)
    EarlyReturn     \* the kinds of call ("put", "commit", "ack") that -- a defect -- return once the primary
                    \* applied them, before the replica has them ({} : none, as shipped)

NoSample == "none"
Status == {"none", "pending", "leased", "acked"}
Calls == ({"put", "commit"} \X Samples) \cup ({"ack"} \X Samples \X Nat)

VARIABLES
    hist,       \* the server states not yet on the replica: hist[1] the replica's, Last(hist) the primary's
    up,         \* the replica runs (FALSE from a crash until the old primary has resynced as the new replica)
    crashes,
    nextLease,  \* lease ids are unique, as the client's lease tokens are
    putDone,    \* samples whose put returned ok to the producer
    pCall,      \* the sample whose put the producer awaits (NoSample: none)
    tPhase,     \* "idle" | "holding" | "train" | "commit" | "ack" | "ackwait"
    tLease,     \* the trainer's lease: <<sample, lease id>>
    tOk,        \* the ack's reply was ok when it ran (else stale: the lease was not live)
    model,      \* the samples the trainer trained, in order
    committed,  \* samples whose ledger commit returned
    acked       \* sample -> how many of its acks returned ok

vars == <<hist, up, crashes, nextLease, putDone, pCall, tPhase, tLease, tOk, model, committed, acked>>

Last(s) == s[Len(s)]
Primary == Last(hist)
Replica == hist[1]

Init0 == [st |-> [s \in Samples |-> "none"], ls |-> [s \in Samples |-> 0],
          tr |-> [s \in Samples |-> FALSE], done |-> {}]

Init ==
    /\ hist = <<Init0>>
    /\ up = TRUE
    /\ crashes = 0
    /\ nextLease = 1
    /\ putDone = {}
    /\ pCall = NoSample
    /\ tPhase = "idle"
    /\ tLease = <<NoSample, 0>>
    /\ tOk = FALSE
    /\ model = <<>>
    /\ committed = {}
    /\ acked = [s \in Samples |-> 0]

TypeOK ==
    /\ hist \in Seq([st : [Samples -> Status], ls : [Samples -> Nat], tr : [Samples -> BOOLEAN],
                     done : SUBSET Calls])
    /\ Len(hist) >= 1
    /\ up \in BOOLEAN
    /\ crashes \in 0..MaxCrashes
    /\ putDone \subseteq Samples
    /\ pCall \in Samples \cup {NoSample}
    /\ tPhase \in {"idle", "holding", "train", "commit", "ack", "ackwait"}
    /\ committed \subseteq Samples
    /\ acked \in [Samples -> Nat]

\* The primary applies a call: the new state is appended to the unreplicated ones (unless nothing changed).
Apply(new) == hist' = IF new = Primary THEN hist ELSE Append(hist, new)

\* A call's effect is back with its client: on the replica (WAIT), or -- the defect -- on the primary alone.
Returned(call) == IF call[1] \in EarlyReturn THEN call \in Primary.done ELSE up /\ call \in Replica.done

\* A call's effect that a failover took back: its client retries it.
Lost(call) == call \notin Primary.done

PutEffect(s) ==
    IF <<"put", s>> \in Primary.done THEN Primary
    ELSE [Primary EXCEPT !.st[s] = IF @ = "none" THEN "pending" ELSE @, !.done = @ \cup {<<"put", s>>}]

CommitEffect(s) == [Primary EXCEPT !.tr[s] = TRUE, !.done = @ \cup {<<"commit", s>>}]

Live(s, l) == Primary.st[s] = "leased" /\ Primary.ls[s] = l

AckEffect(s, l) ==
    IF Live(s, l) THEN [Primary EXCEPT !.st[s] = "acked", !.done = @ \cup {<<"ack", s, l>>}] ELSE Primary

\* -- the producer ---------------------------------------------------------------------------------------------
Put(s) ==
    /\ pCall = NoSample /\ s \notin putDone
    /\ Apply(PutEffect(s))
    /\ pCall' = s
    /\ UNCHANGED <<up, crashes, nextLease, putDone, tPhase, tLease, tOk, model, committed, acked>>

PutReturns ==
    /\ pCall # NoSample /\ Returned(<<"put", pCall>>)
    /\ putDone' = putDone \cup {pCall}
    /\ pCall' = NoSample
    /\ UNCHANGED <<hist, up, crashes, nextLease, tPhase, tLease, tOk, model, committed, acked>>

PutRetried ==
    /\ pCall # NoSample /\ Lost(<<"put", pCall>>)
    /\ Apply(PutEffect(pCall))
    /\ UNCHANGED <<up, crashes, nextLease, putDone, pCall, tPhase, tLease, tOk, model, committed, acked>>

\* -- the trainer ----------------------------------------------------------------------------------------------
Acquire(s) ==
    /\ tPhase = "idle" /\ Primary.st[s] = "pending"
    /\ Apply([Primary EXCEPT !.st[s] = "leased", !.ls[s] = nextLease])
    /\ tLease' = <<s, nextLease>>
    /\ nextLease' = nextLease + 1
    /\ tPhase' = "holding"
    /\ UNCHANGED <<up, crashes, putDone, pCall, tOk, model, committed, acked>>

\* Admission: the ledger (read on the primary) says whether the sample was trained already.
Admit ==
    /\ tPhase = "holding"
    /\ tPhase' = IF Primary.tr[tLease[1]] THEN "ack" ELSE "train"
    /\ UNCHANGED <<hist, up, crashes, nextLease, putDone, pCall, tLease, tOk, model, committed, acked>>

Train ==
    /\ tPhase = "train"
    /\ model' = Append(model, tLease[1])
    /\ Apply(CommitEffect(tLease[1]))
    /\ tPhase' = "commit"
    /\ UNCHANGED <<up, crashes, nextLease, putDone, pCall, tLease, tOk, committed, acked>>

CommitReturns ==
    /\ tPhase = "commit" /\ Returned(<<"commit", tLease[1]>>)
    /\ committed' = committed \cup {tLease[1]}
    /\ tPhase' = "ack"
    /\ UNCHANGED <<hist, up, crashes, nextLease, putDone, pCall, tLease, tOk, model, acked>>

CommitRetried ==
    /\ tPhase = "commit" /\ Lost(<<"commit", tLease[1]>>)
    /\ Apply(CommitEffect(tLease[1]))
    /\ UNCHANGED <<up, crashes, nextLease, putDone, pCall, tPhase, tLease, tOk, model, committed, acked>>

\* The ack runs; its reply (ok, or stale when the lease is not live) is read once it returns.
Ack ==
    /\ tPhase = "ack"
    /\ Apply(AckEffect(tLease[1], tLease[2]))
    /\ tOk' = Live(tLease[1], tLease[2])
    /\ tPhase' = "ackwait"
    /\ UNCHANGED <<up, crashes, nextLease, putDone, pCall, tLease, model, committed, acked>>

AckReturns ==
    /\ tPhase = "ackwait"
    /\ \/ tOk /\ Returned(<<"ack", tLease[1], tLease[2]>>)
          /\ acked' = [acked EXCEPT ![tLease[1]] = @ + 1]
       \/ ~tOk /\ UNCHANGED acked   \* stale: the trainer drops the lease, nothing more
    /\ tPhase' = "idle"
    /\ tLease' = <<NoSample, 0>>
    /\ UNCHANGED <<hist, up, crashes, nextLease, putDone, pCall, tOk, model, committed>>

AckRetried ==
    /\ tPhase = "ackwait" /\ tOk /\ Lost(<<"ack", tLease[1], tLease[2]>>)
    /\ Apply(AckEffect(tLease[1], tLease[2]))
    /\ tOk' = Live(tLease[1], tLease[2])
    /\ UNCHANGED <<up, crashes, nextLease, putDone, pCall, tPhase, tLease, model, committed, acked>>

\* A lease nobody works on any more (its acquire or its ack was taken back by a failover) expires.
Reclaim(s) ==
    /\ Primary.st[s] = "leased"
    /\ tLease # <<s, Primary.ls[s]>>
    /\ Apply([Primary EXCEPT !.st[s] = "pending"])
    /\ UNCHANGED <<up, crashes, nextLease, putDone, pCall, tPhase, tLease, tOk, model, committed, acked>>

\* -- the servers ----------------------------------------------------------------------------------------------
Replicate ==
    /\ up /\ Len(hist) > 1
    /\ hist' = Tail(hist)
    /\ UNCHANGED <<up, crashes, nextLease, putDone, pCall, tPhase, tLease, tOk, model, committed, acked>>

\* The primary's machine is lost: Sentinel promotes the replica with what it has.
Failover ==
    /\ up /\ crashes < MaxCrashes
    /\ hist' = <<Replica>>
    /\ up' = FALSE
    /\ crashes' = crashes + 1
    /\ UNCHANGED <<nextLease, putDone, pCall, tPhase, tLease, tOk, model, committed, acked>>

\* The old primary is back as a replica of the new one: a full resync copies the primary's state.
Resync ==
    /\ ~up
    /\ hist' = <<Primary>>
    /\ up' = TRUE
    /\ UNCHANGED <<crashes, nextLease, putDone, pCall, tPhase, tLease, tOk, model, committed, acked>>

Done ==
    /\ putDone = Samples /\ pCall = NoSample /\ tPhase = "idle"
    /\ \A s \in Samples : Primary.st[s] = "acked"
    /\ UNCHANGED vars

Next ==
    \/ \E s \in Samples : Put(s) \/ Acquire(s) \/ Reclaim(s)
    \/ PutReturns \/ PutRetried
    \/ Admit \/ Train \/ CommitReturns \/ CommitRetried \/ Ack \/ AckReturns \/ AckRetried
    \/ Replicate \/ Failover \/ Resync
    \/ Done

Spec == Init /\ [][Next]_vars

\* Nothing a client was told succeeded is lost: a returned put, ledger commit or ack stands on the primary.
ToldNeverLost ==
    /\ \A s \in putDone : Primary.st[s] # "none"
    /\ \A s \in committed : Primary.tr[s]
    /\ \A s \in Samples : acked[s] > 0 => Primary.st[s] = "acked"

\* No sample is acked effectively twice (an ok ack ends its delivery for good).
NoDuplicateAck == \A s \in Samples : acked[s] <= 1

\* Exactly-once training across failovers: the model holds each sample at most once.
TrainedAtMostOnce == \A s \in Samples : Cardinality({i \in DOMAIN model : model[i] = s}) <= 1

\* At the end every sample was trained exactly once.
AllTrainedOnceAtTheEnd ==
    (putDone = Samples /\ tPhase = "idle" /\ \A s \in Samples : Primary.st[s] = "acked")
        => \A s \in Samples : Cardinality({i \in DOMAIN model : model[i] = s}) = 1
=============================================================================
