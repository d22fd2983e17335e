"""The Redis backend: ``RedisSampleRefQueue`` over Redis Streams, its server-side functions and wire format."""
