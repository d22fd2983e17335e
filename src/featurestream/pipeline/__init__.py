"""The feature pipeline: algorithm schemas (EAGLE-3), the producer, the loader and the async producer thread."""
