"""Where the in-process lifecycle's microseconds go: featurestream's put + acquire + ack next to the reference's.

    python benchmarks/bench_hotpath.py [--depths 1000,300000,1000000] [--ops 5000] [--repeats 7]

Refs only (``bench_queue.NullStore``: the samples count as stored, the store holds nothing), CPU time of
this process (on a loaded machine the wall clock mostly measures waiting for a core), best of ``--repeats``
runs of ``--ops`` lifecycles. featurestream's ``SampleRefQueue`` and the installed reference's alternate run
by run at each depth, so both see the same load; the ratio is the figure issue 26 holds to 2.0x at 1,000
pending.

Then the parts of one lifecycle, each timed alone over ``--ops`` distinct refs (best of ``--repeats``): the three
public calls one at a time (into and out of a queue holding 1,000 samples), the checks a ``put`` makes on its
argument (``check_ref_for``: the ref is a ``SampleRef``, holds no tensor, lives in this queue's store; over refs
never checked before, as a put's), one ``LockedCall`` (the lock, the owed-call check and the store's ``gc``: three
per lifecycle), the consumer's ``Lease``, the two engine events (``Leased``, ``Settled``) built, and those two
events applied by the coordinator (dispatch, the two ``transitions`` lease-machine fires, the ack's scrub), built
included.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import reference_baseline
from bench_queue import NullStore, lifecycle_cost, make_refs

from featurestream import SampleRefQueue
from featurestream.core.arguments import check_ref_for
from featurestream.core.engine import Leased, LeaseModel, Settled
from featurestream.core.lease import Lease, VisibilityTimeout

_TIMER = time.process_time


def _per_op(run: Callable[[], object], ops: int, repeats: int) -> float:
    """Microseconds of CPU per op of ``run`` (which does ``ops`` of them), best of ``repeats``."""
    best = float("inf")
    for _ in range(repeats):
        started = _TIMER()
        run()
        best = min(best, _TIMER() - started)
    return best / ops * 1e6


def lifecycles(depths: list[int], ops: int, repeats: int) -> None:
    reference = reference_baseline.streaming()
    store = NullStore()
    ours_ops = make_refs("op", ops)
    theirs_ops = make_refs("op", ops, reference) if reference is not None else []
    print(f"lifecycle (put + acquire + ack), CPU us, best of {repeats} runs of {ops}")
    print(f"{'pending':>10} {'featurestream':>14} {'reference':>10} {'ratio':>7} {'fs vs first':>12}")
    first = None
    for depth in depths:
        ours_prefill = make_refs("pre", depth)
        theirs_prefill = make_refs("pre", depth, reference) if reference is not None else []
        ours = theirs = float("inf")
        for _ in range(repeats):
            ours = min(ours, lifecycle_cost(lambda: SampleRefQueue(store), ours_prefill, ours_ops, _TIMER))
            if reference is not None:
                theirs = min(
                    theirs,
                    lifecycle_cost(lambda: reference.SampleRefQueue(store), theirs_prefill, theirs_ops, _TIMER),
                )
        del ours_prefill, theirs_prefill
        first = first or ours
        ratio = f"{ours / theirs:6.2f}x" if reference is not None else "      -"
        print(f"{depth:>10} {ours * 1e6:>14.2f} {theirs * 1e6:>10.2f} {ratio} {ours / first:>11.2f}x")


def parts(ops: int, repeats: int) -> None:
    store = NullStore()
    refs = make_refs("part", ops)
    prefill = make_refs("pre", 1000)
    vt = VisibilityTimeout()
    split = {"put": float("inf"), "acquire": float("inf"), "ack": float("inf")}
    for _ in range(repeats):
        queue = SampleRefQueue(store)
        for ref in prefill:
            queue.put(ref)
        started = _TIMER()
        for ref in refs:
            queue.put(ref)
        put_done = _TIMER()
        leases = [queue.acquire(poll_interval=0) for _ in refs]
        acquire_done = _TIMER()
        for lease in leases:
            queue.ack(lease)  # type: ignore[arg-type]
        ack_done = _TIMER()
        for name, seconds in (
            ("put", put_done - started),
            ("acquire", acquire_done - put_done),
            ("ack", ack_done - acquire_done),
        ):
            split[name] = min(split[name], seconds / ops * 1e6)

    queue = SampleRefQueue(store)
    operation = queue._op
    lease_objects = [Lease(ref, 0.0, vt) for ref in refs]

    # Refs no check has seen, as a put's are: the first look at a ref's ``__dict__`` (``check_tensor_free`` counts
    # its attributes) builds that dict, which the refs put above already paid.
    unchecked = iter([make_refs(f"check{round_}-", ops) for round_ in range(repeats)])

    def checks() -> None:
        for ref in next(unchecked):
            check_ref_for(store, ref)

    def operations() -> None:
        for _ in refs:
            with operation:
                pass

    def make_leases() -> None:
        for ref in refs:
            Lease(ref, 0.0, vt)

    def make_events() -> None:
        model = LeaseModel("s")
        for ref, lease in zip(refs, lease_objects, strict=True):
            Leased(model, lease, None)
            Settled(model, "ack", ref, None)

    def apply_events() -> None:
        models = [LeaseModel(ref.sample_id, lease.lease_id) for ref, lease in zip(refs, lease_objects, strict=True)]
        started = _TIMER()
        for model, ref, lease in zip(models, refs, lease_objects, strict=True):
            queue._report(Leased(model, lease, None))
            queue._report(Settled(model, "ack", ref, None))
        return _TIMER() - started

    print(f"\nparts of one lifecycle at 1,000 pending, CPU us, best of {repeats} runs of {ops}")
    rows = [
        ("put", split["put"]),
        ("acquire", split["acquire"]),
        ("ack", split["ack"]),
        ("  put's argument checks (check_ref_for)", _per_op(checks, ops, repeats)),
        ("  3 operations (lock, owed check, gc)", 3 * _per_op(operations, ops, repeats)),
        ("  the Lease", _per_op(make_leases, ops, repeats)),
        ("  2 events built (Leased, Settled)", _per_op(make_events, ops, repeats)),
        ("  2 events built and applied (fires, scrub)", min(apply_events() for _ in range(repeats)) / ops * 1e6),
    ]
    for name, micros in rows:
        print(f"{name:46s} {micros:6.2f}")
    print(f"{'put + acquire + ack':46s} {split['put'] + split['acquire'] + split['ack']:6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default="1000,300000,1000000")
    parser.add_argument("--ops", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    lifecycles([int(depth) for depth in args.depths.split(",")], args.ops, args.repeats)
    parts(args.ops, args.repeats)


if __name__ == "__main__":
    main()
