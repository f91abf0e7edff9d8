"""The fleet's one way to Redis.

- `link`: one pipelined connection (hiredis parsing) that coalesces a loop turn's commands
  into one write; everything else is built on it.
"""
