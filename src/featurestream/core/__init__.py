"""The control plane: sample refs, leases, the lease/backpressure/lifecycle machines and the in-process queue."""
