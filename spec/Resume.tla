------------------------------- MODULE Resume -------------------------------
(***************************************************************************)
(* Exactly-once training across restarts (docs/resume.md): a trainer that *)
(* checkpoints and is restored from its latest checkpoint, a producer     *)
(* restarted independently, the queue between them and the training      *)
(* ledger the queue backend keeps (featurestream.core.resume).             *)
(*                                                                         *)
(* A sample is <<prompt, generation>>.  The trainer (one rank, batches of  *)
(* one) pulls a queued sample, trains it into its model (a sequence of    *)
(* prompts: the history the model's weights contain), commits the prompt  *)
(* to the ledger at that step, then acks the sample.  Save writes the     *)
(* checkpoint (the step and the model) once nothing trained is left       *)
(* uncommitted (state_dict commits first).  A crash loses the model and   *)
(* the held batch (its lease is reclaimed: the sample stays queued); a    *)
(* restore reloads the checkpoint and rolls the ledger back to its step.  *)
(* The producer observes a key (untrained, its current generation not     *)
(* held by the queue), then claims it (the ledger bumps its generation if *)
(* it is still untrained and unchanged), produces and puts; a crash loses *)
(* what it claimed and did not put (orphans).  The producer's two reads   *)
(* are separate steps, as in ResumableProducer.produce_missing.           *)
(*                                                                         *)
(* Safety: the model never holds a prompt twice (nor does a checkpoint).   *)
(* Liveness: under fairness and at most MaxCrashes crashes, the model      *)
(* eventually holds every prompt for good.  TLC runs with deadlock         *)
(* checking on: the end of the run is the explicit step Done.             *)
(***************************************************************************)
EXTENDS Integers, Sequences, FiniteSets

CONSTANTS
    Prompts,        \* the epoch's prompt keys
    MaxCrashes,     \* crashes of the trainer and the producer, together (a model bound)
    BugNoLedger,    \* an ack ends a prompt for good and a restore rolls nothing back (no ledger)
    BugNoAdmission  \* the loader trains whatever it leases (no ledger check at pull)

MaxGen == MaxCrashes + 1
None == <<"none", 0>>
Samples == Prompts \X (1..MaxGen)

VARIABLES
    gen,        \* ledger: each prompt's current generation (0: never produced)
    trained,    \* ledger: the step that trained each prompt (0: untrained)
    queue,      \* samples the queue holds (pending, or leased by the trainer)
    alive,      \* the trainer runs
    model,      \* the trainer's model: the prompts of its steps, in order (volatile)
    batch,      \* the sample the trainer holds (None)
    phase,      \* "idle" | "holding" | "trained" | "committed"
    expired,    \* the held batch's lease expired (a step longer than the visibility timeout)
    ckpt,       \* the latest checkpoint: [step, model] (durable)
    palive,     \* the producer runs
    seen,       \* prompt -> the generation its producer observed as not queued (-1: none)
    inflight,   \* samples claimed and not yet put (lost by a producer crash)
    crashes

vars == <<gen, trained, queue, alive, model, batch, phase, expired, ckpt, palive, seen, inflight, crashes>>

Range(s) == {s[i] : i \in DOMAIN s}
Count(s, p) == Cardinality({i \in DOMAIN s : s[i] = p})

TypeOK ==
    /\ gen \in [Prompts -> 0..MaxGen]
    /\ trained \in [Prompts -> Nat]
    /\ queue \subseteq Samples
    /\ alive \in BOOLEAN /\ palive \in BOOLEAN
    /\ model \in Seq(Prompts)
    /\ batch \in Samples \cup {None}
    /\ phase \in {"idle", "holding", "trained", "committed"}
    /\ expired \in BOOLEAN
    /\ ckpt.step = Len(ckpt.model)
    /\ seen \in [Prompts -> {-1} \cup (0..MaxGen)]
    /\ inflight \subseteq Samples
    /\ crashes \in 0..MaxCrashes

Init ==
    /\ gen = [p \in Prompts |-> 0]
    /\ trained = [p \in Prompts |-> 0]
    /\ queue = {}
    /\ alive = TRUE /\ palive = TRUE
    /\ model = <<>>
    /\ batch = None
    /\ phase = "idle"
    /\ expired = FALSE
    /\ ckpt = [step |-> 0, model |-> <<>>]
    /\ seen = [p \in Prompts |-> -1]
    /\ inflight = {}
    /\ crashes = 0

Admitted(s) == BugNoAdmission \/ (trained[s[1]] = 0 /\ s[2] = gen[s[1]])

(* ResumableProducer.produce_missing: the generations, then the held read *)
(* (a trained key is observed too: the claim refuses it) ...                *)
Observe(p) ==
    /\ palive /\ seen[p] = -1
    /\ gen[p] < MaxGen
    /\ <<p, gen[p]>> \notin queue
    /\ ~\E s \in inflight : s[1] = p
    /\ seen' = [seen EXCEPT ![p] = gen[p]]
    /\ UNCHANGED <<gen, trained, queue, alive, model, batch, phase, expired, ckpt, palive, inflight, crashes>>

(* ... then TrainingLedger.claim: untrained and unchanged, or nothing.     *)
Claim(p) ==
    /\ palive /\ seen[p] # -1
    /\ seen' = [seen EXCEPT ![p] = -1]
    /\ IF trained[p] = 0 /\ gen[p] = seen[p]
       THEN /\ gen' = [gen EXCEPT ![p] = gen[p] + 1]
            /\ inflight' = inflight \cup {<<p, gen[p] + 1>>}
       ELSE UNCHANGED <<gen, inflight>>
    /\ UNCHANGED <<trained, queue, alive, model, batch, phase, expired, ckpt, palive, crashes>>

(* FeatureProducer.produce + queue.put_blocks_until_below.                 *)
Put(s) ==
    /\ palive /\ s \in inflight
    /\ inflight' = inflight \ {s}
    /\ queue' = queue \cup {s}
    /\ UNCHANGED <<gen, trained, alive, model, batch, phase, expired, ckpt, palive, seen, crashes>>

ProducerCrash ==
    /\ palive /\ crashes < MaxCrashes
    /\ palive' = FALSE
    /\ inflight' = {}
    /\ seen' = [p \in Prompts |-> -1]
    /\ crashes' = crashes + 1
    /\ UNCHANGED <<gen, trained, queue, alive, model, batch, phase, expired, ckpt>>

ProducerRestart ==
    /\ ~palive /\ palive' = TRUE
    /\ UNCHANGED <<gen, trained, queue, alive, model, batch, phase, expired, ckpt, seen, inflight, crashes>>

(* The loader's pull: lease a queued sample; TrainerResume.admit drops     *)
(* (acks) one whose prompt is trained or whose generation is stale.        *)
Pull(s) ==
    /\ alive /\ phase = "idle" /\ s \in queue
    /\ IF Admitted(s)
       THEN /\ batch' = s /\ phase' = "holding"
            /\ UNCHANGED queue
       ELSE /\ queue' = queue \ {s}
            /\ UNCHANGED <<batch, phase>>
    /\ expired' = FALSE
    /\ UNCHANGED <<gen, trained, alive, model, ckpt, palive, seen, inflight, crashes>>

(* The recipe's training step on the batch handed out.                     *)
Train ==
    /\ alive /\ phase = "holding"
    /\ model' = Append(model, batch[1])
    /\ phase' = "trained"
    /\ UNCHANGED <<gen, trained, queue, alive, batch, expired, ckpt, palive, seen, inflight, crashes>>

(* consume_now: TrainerResume.commit, before the ack.                     *)
Commit ==
    /\ alive /\ phase = "trained"
    /\ trained' = [trained EXCEPT ![batch[1]] = IF @ = 0 THEN Len(model) ELSE @]
    /\ phase' = "committed"
    /\ UNCHANGED <<gen, queue, alive, model, batch, expired, ckpt, palive, seen, inflight, crashes>>

(* An expired lease's ack is stale: its sample was redelivered, it stays queued. *)
Ack ==
    /\ alive /\ phase = "committed"
    /\ queue' = IF expired THEN queue ELSE queue \ {batch}
    /\ batch' = None /\ phase' = "idle"
    /\ UNCHANGED <<gen, trained, alive, model, expired, ckpt, palive, seen, inflight, crashes>>

(* The reaper reclaims the held batch's lease: the step outlived the visibility timeout. *)
Expire ==
    /\ alive /\ phase # "idle" /\ ~expired
    /\ expired' = TRUE
    /\ UNCHANGED <<gen, trained, queue, alive, model, batch, phase, ckpt, palive, seen, inflight, crashes>>

(* The recipe saves {"loader": state_dict(), ...} with the model.          *)
Save ==
    /\ alive /\ phase = "idle" /\ ckpt.step # Len(model)
    /\ ckpt' = [step |-> Len(model), model |-> model]
    /\ UNCHANGED <<gen, trained, queue, alive, model, batch, phase, expired, palive, seen, inflight, crashes>>

(* SIGKILL: the model and the held batch are lost; its lease is reclaimed, *)
(* so the sample stays queued.                                              *)
TrainerCrash ==
    /\ alive /\ crashes < MaxCrashes
    /\ alive' = FALSE
    /\ model' = <<>> /\ batch' = None /\ phase' = "idle" /\ expired' = FALSE
    /\ crashes' = crashes + 1
    /\ UNCHANGED <<gen, trained, queue, ckpt, palive, seen, inflight>>

(* A new trainer: load_state_dict of the latest checkpoint, TrainingLedger.restore. *)
TrainerRestore ==
    /\ ~alive /\ alive' = TRUE
    /\ model' = ckpt.model
    /\ trained' = IF BugNoLedger THEN trained
                  ELSE [p \in Prompts |-> IF trained[p] > ckpt.step THEN 0 ELSE trained[p]]
    /\ UNCHANGED <<gen, queue, batch, phase, expired, ckpt, palive, seen, inflight, crashes>>

AllTrained == alive /\ \A p \in Prompts : p \in Range(model)

(* The end of the run, as the loader decides it (TrainerResume.epoch_done): *)
(* the ledger has every prompt trained and nothing is left to pull.         *)
Done ==
    /\ alive /\ phase = "idle" /\ queue = {} /\ inflight = {}
    /\ \A p \in Prompts : trained[p] # 0
    /\ UNCHANGED vars

Next ==
    \/ \E p \in Prompts : Observe(p) \/ Claim(p)
    \/ \E s \in Samples : Put(s) \/ Pull(s)
    \/ ProducerCrash \/ ProducerRestart
    \/ Train \/ Commit \/ Ack \/ Save \/ Expire
    \/ TrainerCrash \/ TrainerRestore
    \/ Done

(* Crashes are not fair; everything else eventually happens when enabled. *)
Fairness ==
    /\ \A p \in Prompts : WF_vars(Observe(p)) /\ WF_vars(Claim(p))
    /\ \A s \in Samples : WF_vars(Put(s)) /\ WF_vars(Pull(s))
    /\ WF_vars(ProducerRestart) /\ WF_vars(TrainerRestore)
    /\ WF_vars(Train) /\ WF_vars(Commit) /\ WF_vars(Ack)

Spec == Init /\ [][Next]_vars /\ Fairness

(* Safety: no prompt twice in the model, nor in the checkpoint.            *)
AtMostOnce ==
    /\ \A p \in Prompts : Count(model, p) <= 1
    /\ \A p \in Prompts : Count(ckpt.model, p) <= 1

(* The ledger agrees with the live model: each prompt it has trained sits  *)
(* at that step of the model (so the loader's end is the model's end).     *)
LedgerMatchesModel ==
    alive => \A p \in Prompts : trained[p] # 0 => trained[p] <= Len(model) /\ model[trained[p]] = p

(* Liveness: the model eventually holds every prompt, for good.           *)
EventuallyAllTrained == <>[]AllTrained
=============================================================================
