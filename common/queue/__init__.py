"""The durable per-session FIFO job queue on Redis (see ARCHITECTURE.md, "Redis data model").

- `Queue`: enqueue (idempotent, batch), read/cancel jobs, output, sessions; the worker-side
  fenced operations; the reconciler's repair primitives.
- `Consumer` + `JobContext`: the worker runtime driving a handler callback; `leases`: its lease
  keeping (renewal, cancel requests, loss).
- `JobWaiter`: wait for terminal jobs over one shared subscription.
- `keys`: every key name; `scripts`: the Lua scripts (in `lua/`) and their typed calls (sent
  through `common.redis.scripts`).
"""

from common.queue.consumer import Consumer
from common.queue.context import Handler, JobContext
from common.queue.keys import Keys, session_name, split_session
from common.queue.models import (
    PROBLEM_CANCELLED,
    PROBLEM_INVALID_RESULT,
    PROBLEM_RETRIES_EXHAUSTED,
    TERMINAL_STATES,
    EnqueueResult,
    HandlerOutcome,
    IdempotencyConflict,
    JobCancelled,
    JobFailed,
    JobKind,
    JobRecord,
    JobState,
    LeaseLost,
    NewJob,
    QueueError,
    RedisFull,
    RetryLater,
)
from common.queue.queue import Queue
from common.queue.scripts import Handoff, Lease
from common.queue.waiter import JobWaiter, Outcome, Watch

__all__ = [
    "PROBLEM_CANCELLED",
    "PROBLEM_INVALID_RESULT",
    "PROBLEM_RETRIES_EXHAUSTED",
    "TERMINAL_STATES",
    "Consumer",
    "EnqueueResult",
    "Handoff",
    "Handler",
    "HandlerOutcome",
    "IdempotencyConflict",
    "JobCancelled",
    "JobContext",
    "JobFailed",
    "JobKind",
    "JobRecord",
    "JobState",
    "JobWaiter",
    "Keys",
    "Lease",
    "LeaseLost",
    "NewJob",
    "Outcome",
    "Queue",
    "QueueError",
    "RedisFull",
    "RetryLater",
    "Watch",
    "session_name",
    "split_session",
]
