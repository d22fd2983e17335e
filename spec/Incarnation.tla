----------------------------- MODULE Incarnation -----------------------------
(***************************************************************************)
(* Incarnations never cross (docs/data-plane.md, stores/ledger.py): one   *)
(* sample id is put, settled (scrubbed by the queue or freed by its last  *)
(* release) and put again, up to MaxPuts times.  Every put mints a fresh  *)
(* incarnation, carried by its ref; a get mints a handle of the ref's     *)
(* incarnation.  Refs live for ever (a producer's copy, a dead letter, a  *)
(* consumer's stale lease) and readers release their handles whenever     *)
(* they like, so refs and handles of earlier incarnations keep acting on  *)
(* the store after the id was put again: get, retain, scrub, release.     *)
(*                                                                         *)
(* The store keeps one entry for the id: the incarnation its bytes are,   *)
(* the readers holding handles on it, whether a queue retains it.  A ref  *)
(* or a handle acts on the entry only when its incarnation is the        *)
(* entry's; anything else is a stale call that touches nothing (a         *)
(* KeyError or a no-op), which is a stuttering step here.  Every effect  *)
(* is logged as <<what, incarnation of the caller, incarnation affected>>. *)
(*                                                                         *)
(* Safety: a ref or handle never serves, retains, scrubs or frees another *)
(* incarnation (IncarnationsNeverCross).  TLC runs with deadlock checking *)
(* on: the end of the run is the explicit step Done.                      *)
(*                                                                         *)
(* The mutant BugHandlesWithoutIncarnation is the store before handles   *)
(* carried their incarnation: a handle is found by its id, the entry by   *)
(* the sample id, so a stale reader's release after a re-put counts down  *)
(* the new incarnation's handles and frees it.                            *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets

CONSTANTS
    MaxPuts,                      \* puts of the one sample id (a model bound)
    Readers,                      \* processes that get and release
    BugHandlesWithoutIncarnation  \* a handle's release finds the id's current entry, whatever its incarnation

Incs == 1..MaxPuts
NoEntry == [inc |-> 0, handles |-> {}, retained |-> FALSE]
Effects == {"serve", "retain", "scrub", "free"}

VARIABLES
    puts,     \* incarnations minted so far (the latest is puts)
    entry,    \* the store's entry for the id (NoEntry: not resident)
    bytes,    \* the incarnation whose bytes the store holds (0: none)
    held,     \* handles out, <<reader, incarnation>>: each reader releases each of its handles once
    log       \* every effect, <<what, the caller's incarnation, the incarnation it affected>>

vars == <<puts, entry, bytes, held, log>>

TypeOK ==
    /\ puts \in 0..MaxPuts
    /\ entry.inc \in 0..MaxPuts /\ entry.handles \subseteq Readers /\ entry.retained \in BOOLEAN
    /\ bytes \in 0..MaxPuts
    /\ held \subseteq Readers \X Incs
    /\ log \subseteq Effects \X Incs \X Incs

Resident == entry.inc # 0

(* A ref of incarnation i names the entry only if the entry is that put's. *)
RefMatches(i) == Resident /\ entry.inc = i

(* A handle's release: by its incarnation, or (the mutant) by its sample id alone. *)
HandleMatches(r, i) ==
    IF BugHandlesWithoutIncarnation THEN Resident ELSE RefMatches(i) /\ r \in entry.handles

Free(by) ==
    /\ log' = log \cup {<<"free", by, entry.inc>>}
    /\ entry' = NoEntry /\ bytes' = 0

(* LedgerFeatureStore.put: admitted only when the id is not resident (a duplicate is refused). *)
Put ==
    /\ ~Resident /\ puts < MaxPuts
    /\ puts' = puts + 1
    /\ entry' = [inc |-> puts + 1, handles |-> {}, retained |-> FALSE]
    /\ bytes' = puts + 1
    /\ UNCHANGED <<held, log>>

(* get(ref): a handle on the bytes of the ref's own incarnation; a stale ref's get raises KeyError. *)
Get(r, i) ==
    /\ i <= puts /\ RefMatches(i) /\ <<r, i>> \notin held
    /\ held' = held \cup {<<r, i>>}
    /\ entry' = [entry EXCEPT !.handles = @ \cup {r}]
    /\ log' = log \cup {<<"serve", i, bytes>>}
    /\ UNCHANGED <<puts, bytes>>

(* retain(ref): a queue holds the sample (a stale ref marks nothing). *)
Retain(i) ==
    /\ i <= puts /\ RefMatches(i) /\ ~entry.retained
    /\ entry' = [entry EXCEPT !.retained = TRUE]
    /\ log' = log \cup {<<"retain", i, entry.inc>>}
    /\ UNCHANGED <<puts, bytes, held>>

(* scrub(ref): the queue settled it (or a producer discards it): freed whatever handles are out. *)
Scrub(i) ==
    /\ i <= puts /\ RefMatches(i)
    /\ log' = log \cup {<<"scrub", i, entry.inc>>}
    /\ entry' = NoEntry /\ bytes' = 0
    /\ UNCHANGED <<puts, held>>

(* release(handle): idempotent; the last handle of an unretained sample frees it. *)
Release(r, i) ==
    /\ <<r, i>> \in held
    /\ held' = held \ {<<r, i>>}
    /\ IF HandleMatches(r, i)
       THEN IF entry.handles \ {r} = {} /\ ~entry.retained
            THEN Free(i)
            ELSE /\ entry' = [entry EXCEPT !.handles = @ \ {r}]
                 /\ UNCHANGED <<bytes, log>>
       ELSE UNCHANGED <<entry, bytes, log>>
    /\ UNCHANGED puts

(* The end of the run: every put made and settled, every handle released. *)
Done ==
    /\ puts = MaxPuts /\ ~Resident /\ held = {}
    /\ UNCHANGED vars

Init ==
    /\ puts = 0
    /\ entry = NoEntry
    /\ bytes = 0
    /\ held = {}
    /\ log = {}

Next ==
    \/ Put
    \/ \E i \in Incs : Retain(i) \/ Scrub(i)
    \/ \E r \in Readers, i \in Incs : Get(r, i) \/ Release(r, i)
    \/ Done

Spec == Init /\ [][Next]_vars

(* The store's bytes are its entry's incarnation's. *)
BytesAreTheEntrys == bytes = entry.inc

(* Safety: whatever a ref or handle of incarnation i does, it affects incarnation i only. *)
IncarnationsNeverCross == \A e \in log : e[2] = e[3]
=============================================================================
