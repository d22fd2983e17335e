---- MODULE LeaseQueueTrace ----
(* Trace validation: does LeaseQueue admit the implementation traces of TraceData, names and values?     *)
(* featurestream.spec.trace generates TraceData (TraceSamples, TraceConsumers, Log, Exact, Visibility)   *)
(* from recorded traces and runs TLC on this module; see spec/README.md.                                 *)
EXTENDS LeaseQueue, TraceData, Integers, Sequences, FiniteSets, TLC

Unknown == -1
Slack == 1  \* one tick of rounding between a float deadline and its ticks

(* clock: the queue's clock; dl[l]: lease l's deadline (Unknown until traced); done: the events ahead of *)
(* the cursor already taken (see Ahead).                                                                *)
VARIABLES tr, i, clock, dl, done
traceVars == <<tr, i, clock, dl, done>>
VisibilityTicks == Visibility[tr]  \* trace tr's visibility timeout in its ticks; Unknown: not checked

Known(x) == x # Unknown
Chk(v, x) == IF Known(v) THEN v = x ELSE TRUE
Leased(st) == Cardinality({s \in Samples : st[s] = "leased"})
(* A store fault that changes nothing but the fault count. *)
FaultOnly == Fault /\ UNCHANGED <<status, queue, deliveries, lease, held, handles, storeVars, bp, lifecycle,
                                 window, backlog, kept, envVars>>
(* A put refused after its retain (a retain fault, or close) whose unretain failed too: the queue owes the *)
(* unretain (as the spec's ClosedRaise with a fault).                                                       *)
RefusedPutOwed(s) ==
    /\ status[s] = "stored" /\ Fault /\ retained' = retained \cup {s} /\ backlog' = backlog \cup {s}
    /\ UNCHANGED <<status, queue, deliveries, lease, held, handles, resident, hcount, residentBytes, bp, lifecycle,
                   window, kept, envVars>>
(* The lease a StaleRejected event names is not live: never issued, settled or reclaimed -- or a forged copy. *)
NotLive(e) == IF e.l = 0 \/ e.f THEN TRUE ELSE \A t \in held[e.l] : lease[t[1]][t[2]] # "leased"
(* A settle of the lease e names (attempt e.n when traced) that consumer e.l holds.  A reject takes the *)
(* lease machine's Fail edge.                                                                           *)
Settles(e, name) == e.l \in Consumers /\ \E t \in held[e.l] :
                     /\ t[1] = e.s /\ Chk(e.n, t[2]) /\ CanFire(IF name = "Reject" THEN "Fail" ELSE name, t[1], t[2])
                     /\ CASE name = "Ack" -> AckCore(e.l, t, e.f)
                          [] name = "Fail" -> FailCore(e.l, t, e.f)
                          [] name = "Reject" -> RejectCore(e.l, t, e.f)
                          [] name = "GiveBack" -> GiveBackCore(e.l, t)
                          [] name = "Extend" -> Extend(e.l, t)

(* The event at the cursor, matched to the spec action it names. *)
Match(e) ==
    CASE e.a = "StorePut" -> StorePut(e.s)
      [] e.a = "StoreGet" -> \E c \in Consumers : Get(c, e.s)
      [] e.a = "StoreRelease" -> \E c \in Consumers : e.s \in handles[c] /\ Release(c, e.s)
      [] e.a = "StoreScrub" -> status[e.s] \in Terminal \cup {"discarded"} /\ UNCHANGED vars
      [] e.a = "Put" -> Chk(e.n, 0) /\ Put(e.s)
      [] e.a = "DedupRefused" -> Reput(e.s) /\ UNCHANGED vars
      [] e.a = "Acquire" -> e.l \in Consumers /\ queue # <<>> /\ Head(queue) = e.s /\ Chk(e.n, deliveries[e.s])
                            /\ Acquire(e.l)
      [] e.a = "Ack" -> Settles(e, "Ack") /\ UNCHANGED <<lifecycle, envVars>>
      \* a reject is traced as the Fail that dead-letters it (Untrainable: see featurestream.spec.trace)
      [] e.a = "Fail" -> (Settles(e, "Fail") \/ Settles(e, "Reject")) /\ UNCHANGED <<lifecycle, envVars>>
                         /\ status'[e.s] = e.o
      [] e.a = "GiveBack" -> Settles(e, "GiveBack") /\ UNCHANGED <<lifecycle, envVars>>
      [] e.a = "Reclaim" -> e.l \in Consumers /\ <<e.s, deliveries[e.s]>> \in held[e.l] /\ Chk(e.n, deliveries[e.s])
                            /\ ReclaimCore(e.s, e.f) /\ UNCHANGED <<lifecycle, envVars>> /\ status'[e.s] = e.o
      [] e.a = "DeadLetter" -> status[e.s] = "dead" /\ Chk(e.n, deliveries[e.s]) /\ UNCHANGED vars
                               /\ (e.o = "kept" => e.s \in kept) /\ (e.o = "scrubbed" => e.s \notin kept)
      [] e.a = "RequeueDeadLetter" -> Chk(e.n, 0) /\ RequeueDeadLetter(e.s)
      [] e.a = "PurgeDeadLetter" -> PurgeDead(e.s, e.f)
      [] e.a = "Extend" -> Settles(e, "Extend")
      [] e.a = "StaleRejected" -> NotLive(e) /\ UNCHANGED vars
      [] e.a = "Resident" -> (IF Exact[tr] THEN resident ELSE {s \in resident : status[s] # "stored"}) = e.obs
                             /\ UNCHANGED vars
      [] e.a = "Pause" -> Pause
      [] e.a = "Resume" -> Resume
      [] e.a = "Close" -> Close
      [] e.a = "Drain" -> Drain
      [] e.a = "ScrubFault" -> e.s \in backlog /\ UNCHANGED vars
      [] e.a = "ScrubRetried" -> RetryScrub(e.s, FALSE)
      [] e.a = "RetryFault" -> RetryScrub(e.s, TRUE)
      [] e.a = "RetainFault" -> status[e.s] = "stored" /\ FaultOnly  \* also once closed: Redis retains first
      [] e.a = "UnretainFault" -> IF e.s \in backlog THEN RetryScrub(e.s, TRUE) ELSE RefusedPutOwed(e.s)
      [] e.a = "OtherFault" -> FaultOnly
      [] OTHER -> FALSE

(* The state the event reports it left: counts and residency of the spec's next state. *)
(* Without the store's events (Exact[tr] false) the store may hold samples the trace never names: *)
(* resident bytes are then checked as a lower bound.                                              *)
Values(e) ==
    /\ Chk(e.pend, Len(queue')) /\ Chk(e.out, Leased(status'))
    /\ IF Known(e.rb) /\ ~Exact[tr] THEN e.rb >= residentBytes' ELSE Chk(e.rb, residentBytes')

(* The clock never goes back; Acquire sets the deadline to the call's clock + the visibility timeout; *)
(* Extend only a lease not yet expired, to a deadline not in the past; Reclaim only at/after it.     *)
Time(e) ==
    /\ IF Known(e.now) THEN e.now >= clock /\ clock' = e.now ELSE clock' = clock
    /\ CASE e.a = "Acquire" ->
              /\ Known(e.dl) /\ Known(VisibilityTicks) =>
                    /\ Known(clock) => e.dl >= clock + VisibilityTicks - Slack
                    /\ Known(e.now) => e.dl <= e.now + VisibilityTicks + Slack
              /\ dl' = [dl EXCEPT ![e.l] = e.dl]
          [] e.a = "Extend" ->
              /\ Known(dl[e.l]) => dl[e.l] >= clock  \* its reap spared it (ties: rounding)
              /\ Known(e.dl) => e.dl >= clock
              /\ dl' = [dl EXCEPT ![e.l] = e.dl]
          [] e.a = "Reclaim" ->
              /\ Known(e.dl) /\ Known(dl[e.l]) => e.dl = dl[e.l]
              /\ LET due == IF Known(e.dl) THEN e.dl ELSE dl[e.l] IN Known(due) /\ Known(e.now) => e.now >= due
              /\ UNCHANGED dl
          [] OTHER -> UNCHANGED dl

TraceInit == /\ tr \in 1..Len(Log) /\ i = 1 /\ clock = Unknown /\ dl = [l \in TraceConsumers |-> Unknown]
             /\ done = {} /\ Init
Take(e) == Match(e) /\ Values(e) /\ Time(e)
(* The event at the cursor -- or, taken already, skipped. *)
TraceStep == i <= Len(Log[tr]) /\ i' = i + 1 /\ done' = done \ {i} /\ UNCHANGED tr /\
             IF i \in done THEN UNCHANGED <<vars, clock, dl>> ELSE Take(Log[tr][i])
(* An event that may have taken effect before the cursor's (its field ah, from _linearize): the first of them *)
(* not taken yet.                                                                                            *)
Ahead == i <= Len(Log[tr]) /\ i \notin done /\ UNCHANGED <<tr, i>> /\
         LET later == Log[tr][i].ah \ done IN
         \E j \in later : (\A k \in later : j <= k) /\ Take(Log[tr][j]) /\ done' = done \cup {j}
(* The end of a validation, consumed or stuck: an explicit terminal step, so TLC runs with deadlock checking. *)
TraceHalt == (i > Len(Log[tr]) \/ ~ENABLED (TraceStep \/ Ahead)) /\ UNCHANGED <<vars, traceVars>>
TraceNext == TraceStep \/ Ahead \/ TraceHalt
TraceSpec == TraceInit /\ [][TraceNext]_<<vars, traceVars>>

(* The verdicts, printed rather than raised as violations (a violation would print the whole behaviour): *)
(* "matched" when trace tr is fully consumed, "stuck" when no spec action matches its event i.          *)
(* A stuck report says which part failed: the action itself, the values it reports, or its timing. *)
TraceReport ==
    /\ i > Len(Log[tr]) => PrintT(<<"matched", tr>>)
    /\ i <= Len(Log[tr]) /\ ~ENABLED (TraceStep \/ Ahead) =>
          LET e == Log[tr][i] IN
          PrintT(<<"stuck", tr, i, ENABLED Match(e), ENABLED (Match(e) /\ Values(e)), ENABLED (Match(e) /\ Time(e))>>)
====
