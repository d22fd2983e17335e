"""The in-process backend: ``SampleRefQueue`` over ``MemoryEngine`` (plain Python structures, one lock)."""
