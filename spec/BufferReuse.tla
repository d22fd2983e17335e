----------------------------- MODULE BufferReuse -----------------------------
(***************************************************************************)
(* Reused buffers are never seen through an older handle (stores/arena.py, *)
(* stores/pool.py, docs/data-plane.md).  One writer puts MaxPuts samples,  *)
(* each a fresh incarnation, into a fixed set of Slots (its arena's files, *)
(* or its pool's blocks) that it reuses; readers get samples by their data *)
(* name and read them (a copy, or a mapping they keep reading until they  *)
(* release it); a queue scrubs any sample whenever it likes, whatever     *)
(* handles are out.                                                        *)
(*                                                                         *)
(* A slot is a file the data name of at most one incarnation links to     *)
(* (link[s]: 0 none).  The writer takes a slot only when no data name     *)
(* links to it and it gets the slot's exclusive lock without waiting (no   *)
(* reader holds the shared one), writes the new incarnation's bytes,      *)
(* links the new data name to it and unlocks.  A reader opens a data name *)
(* (the slot it names then), takes the shared lock (waiting out a writer  *)
(* holding the exclusive one), checks the name still names that slot --   *)
(* else its get raises KeyError -- and reads until it releases.  For the  *)
(* local pool the shared lock is a tensor viewing the block (its storage  *)
(* count) and the exclusive lock the count being one.                     *)
(*                                                                         *)
(* Safety: every read sees the bytes of the incarnation the reader's      *)
(* handle names (ReadersSeeTheirOwn).  TLC runs with deadlock checking on: *)
(* the end of the run is the explicit step Done.                          *)
(*                                                                         *)
(* Mutants: BugReuseWhileHeld = TRUE, a writer that recycles a slot as     *)
(* soon as no data name links to it, while a reader still holds it (a     *)
(* pool without the storage count, an arena without the lock);            *)
(* BugNoNameCheck = TRUE, a reader that trusts the file it opened without *)
(* checking, after its lock, that the name still names it.                *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets

CONSTANTS
    MaxPuts,            \* incarnations the writer puts (a model bound)
    Slots,              \* the arena's files (the pool's blocks)
    Readers,            \* processes that get, read and release
    BugReuseWhileHeld,  \* the writer ignores readers' shared locks
    BugNoNameCheck,     \* a reader skips the check that the name still names the slot it opened
    None                \* no slot (a model value)

ASSUME None \notin Slots

Incs == 1..MaxPuts

VARIABLES
    puts,     \* incarnations put so far
    bytes,    \* bytes[s]: the incarnation whose bytes slot s holds (0: none yet)
    link,     \* link[s]: the incarnation whose data name links to slot s (0: none)
    wlock,    \* the slot the writer holds exclusively while it writes (None: none)
    pc,       \* pc[r]: "idle", "opened", "locked" (shared lock held, not yet checked), "reading"
    want,     \* want[r]: the incarnation the reader's handle names (0: none)
    slot,     \* slot[r]: the slot the reader opened (None: none)
    log       \* every read, <<incarnation the handle names, incarnation whose bytes it saw>>

vars == <<puts, bytes, link, wlock, pc, want, slot, log>>

TypeOK ==
    /\ puts \in 0..MaxPuts
    /\ bytes \in [Slots -> 0..MaxPuts] /\ link \in [Slots -> 0..MaxPuts]
    /\ wlock \in Slots \cup {None}
    /\ pc \in [Readers -> {"idle", "opened", "locked", "reading"}]
    /\ want \in [Readers -> 0..MaxPuts] /\ slot \in [Readers -> Slots \cup {None}]
    /\ log \subseteq Incs \X (0..MaxPuts)

SharedHeld(s) == \E r \in Readers : pc[r] \in {"locked", "reading"} /\ slot[r] = s

(* The writer takes a free slot: nothing links to it, and its exclusive lock is granted at once. *)
TakeSlot(s) ==
    /\ puts < MaxPuts /\ wlock = None /\ link[s] = 0
    /\ BugReuseWhileHeld \/ ~SharedHeld(s)
    /\ wlock' = s
    /\ UNCHANGED <<puts, bytes, link, pc, want, slot, log>>

(* ... writes the next incarnation's bytes into it, links its data name to it and unlocks. *)
WriteAndLink ==
    /\ wlock # None
    /\ puts' = puts + 1
    /\ bytes' = [bytes EXCEPT ![wlock] = puts + 1]
    /\ link' = [link EXCEPT ![wlock] = puts + 1]
    /\ wlock' = None
    /\ UNCHANGED <<pc, want, slot, log>>

(* A queue's scrub (or a last release): the data name goes, whatever handles are out. *)
Scrub(s) ==
    /\ link[s] # 0
    /\ link' = [link EXCEPT ![s] = 0]
    /\ UNCHANGED <<puts, bytes, wlock, pc, want, slot, log>>

(* get: open the data name of incarnation i (the slot it links to now). *)
Open(r, i) ==
    /\ pc[r] = "idle" /\ \E s \in Slots : link[s] = i
    /\ pc' = [pc EXCEPT ![r] = "opened"]
    /\ want' = [want EXCEPT ![r] = i]
    /\ slot' = [slot EXCEPT ![r] = CHOOSE s \in Slots : link[s] = i]
    /\ UNCHANGED <<puts, bytes, link, wlock, log>>

(* ... take the shared lock, waiting while the writer holds the exclusive one. *)
Lock(r) ==
    /\ pc[r] = "opened" /\ wlock # slot[r]
    /\ pc' = [pc EXCEPT ![r] = "locked"]
    /\ UNCHANGED <<puts, bytes, link, wlock, want, slot, log>>

(* ... check the name still names the slot: else KeyError, and the lock goes with the file. *)
Check(r) ==
    /\ pc[r] = "locked"
    /\ IF BugNoNameCheck \/ link[slot[r]] = want[r]
       THEN /\ pc' = [pc EXCEPT ![r] = "reading"]
            /\ UNCHANGED <<want, slot>>
       ELSE /\ pc' = [pc EXCEPT ![r] = "idle"]
            /\ want' = [want EXCEPT ![r] = 0]
            /\ slot' = [slot EXCEPT ![r] = None]
    /\ UNCHANGED <<puts, bytes, link, wlock, log>>

(* A read of what the reader holds: a copy once, or its mapping, as often as it likes until it releases. *)
Read(r) ==
    /\ pc[r] = "reading"
    /\ log' = log \cup {<<want[r], bytes[slot[r]]>>}
    /\ UNCHANGED <<puts, bytes, link, wlock, pc, want, slot>>

(* release (or the last tensor of the mapping dropped): the shared lock goes. *)
Release(r) ==
    /\ pc[r] = "reading"
    /\ pc' = [pc EXCEPT ![r] = "idle"]
    /\ want' = [want EXCEPT ![r] = 0]
    /\ slot' = [slot EXCEPT ![r] = None]
    /\ UNCHANGED <<puts, bytes, link, wlock, log>>

(* The end of the run: every put made and scrubbed, every reader done. *)
Done ==
    /\ puts = MaxPuts /\ wlock = None
    /\ \A s \in Slots : link[s] = 0
    /\ \A r \in Readers : pc[r] = "idle"
    /\ UNCHANGED vars

Init ==
    /\ puts = 0
    /\ bytes = [s \in Slots |-> 0]
    /\ link = [s \in Slots |-> 0]
    /\ wlock = None
    /\ pc = [r \in Readers |-> "idle"]
    /\ want = [r \in Readers |-> 0]
    /\ slot = [r \in Readers |-> None]
    /\ log = {}

Next ==
    \/ \E s \in Slots : TakeSlot(s) \/ Scrub(s)
    \/ WriteAndLink
    \/ \E r \in Readers : Lock(r) \/ Check(r) \/ Read(r) \/ Release(r) \/ \E i \in Incs : Open(r, i)
    \/ Done

Spec == Init /\ [][Next]_vars

(* A data name links to the slot holding its incarnation's bytes. *)
NamesHoldTheirBytes == \A s \in Slots : link[s] # 0 => bytes[s] = link[s]

(* Safety: a reader only ever sees the bytes of the incarnation its handle names. *)
ReadersSeeTheirOwn == \A e \in log : e[1] = e[2]
=============================================================================
