"""The Redis backend: ``RedisSampleRefQueue``, its server-side functions (Lua) and its wire format."""
