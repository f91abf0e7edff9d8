"""The fleet's one way to Redis.

- `settings`: `RedisSettings`, parsed once from the URL at start (TLS, credentials, db, timeouts,
  health checks); unsupported options are refused by name. redis-py (arq) gets its pool from it.
- `link`: one pipelined connection (hiredis parsing) that coalesces a loop turn's commands into
  one write, with the settings' timeouts and health checks.
- `client`: `RedisClient`, one per process role: a typed method per command over the link;
  blocking commands on connections of their own; pub/sub.
- `errors`: Redis's error replies and connection failures as redis-py's public exceptions.
- `scripts`: every Lua script, with the keys its header declares, sent as EVALSHA.
"""
