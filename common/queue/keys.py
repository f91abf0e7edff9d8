"""Every Redis key name and channel the queue uses, built in one place.

Per-session keys carry the session as a hash tag, `{env/sid}`, so that one session's keys would
share a slot on a cluster. The scripts also touch the fleet-wide keys (`ready`, `events`, ...), so
the queue as a whole needs a single Redis node; the tags are for locality, not for Cluster.

Python builds every name here: the KEYS each script declares (common/redis/scripts.py) and the
keys it reads directly. A script computes a name itself only from data it reads (a job id from a
FIFO), with the builders `Keys.lua_prelude` generates from the same shapes.
"""

from __future__ import annotations

from dataclasses import dataclass


def session_name(environment: str, session_id: str) -> str:
    """The string form of a session, `env/sid`, used in keys, events and headers."""
    return f"{environment}/{session_id}"


def split_session(name: str) -> tuple[str, str]:
    """Inverse of `session_name`: environment names contain no '/', session ids may."""
    env, _, sid = name.partition("/")
    return env, sid


@dataclass(frozen=True)
class Keys:
    """Key names under one prefix (`config.redis_prefix`)."""

    prefix: str

    # -- fleet-wide keys -------------------------------------------------------------------------
    @property
    def ready(self) -> str:
        """Stream: one entry per session that has work and no owner while no worker had a free
        slot announced (otherwise the session is handed to a worker directly)."""
        return f"{self.prefix}ready"

    @property
    def idle(self) -> str:
        """Zset worker id → free slots it announced and has not been handed yet (> 0 only)."""
        return f"{self.prefix}idle"

    @property
    def idle_until(self) -> str:
        """Hash worker id → unix ms its announcement lasts (a worker renews it while it runs)."""
        return f"{self.prefix}idle_until"

    @property
    def events(self) -> str:
        """Stream of job state changes."""
        return f"{self.prefix}events"

    @property
    def callbacks(self) -> str:
        """Stream: the terminal events of jobs with a callback_url (the webhook feeder's input), so
        the deliverer reads only what it delivers instead of every state change of every job."""
        return f"{self.prefix}callbacks"

    @property
    def audit(self) -> str:
        """Stream, capped by length and age: the audit log (common/audit.py), apart from `events`."""
        return f"{self.prefix}audit"

    @property
    def dlq(self) -> str:
        """Stream of jobs that exhausted their attempts."""
        return f"{self.prefix}dlq"

    @property
    def delayed(self) -> str:
        """Zset session → unix ms when its retry backoff ends."""
        return f"{self.prefix}delayed"

    @property
    def active(self) -> str:
        """Zset session → unix ms when its lease expires (owned sessions only)."""
        return f"{self.prefix}active"

    @property
    def work(self) -> str:
        """Zset session → unix ms of the first enqueue: sessions whose FIFO is not empty."""
        return f"{self.prefix}work"

    @property
    def running(self) -> str:
        """Zset session → unix ms it was resumed: sessions whose actor the fleet runs (the
        candidates pressure parking picks from; see common.capacity)."""
        return f"{self.prefix}running"

    @property
    def parked(self) -> str:
        """Zset session → unix ms the fleet parked it (idle, pressure, auto_resume): a call wakes it."""
        return f"{self.prefix}parked"

    @property
    def capacity_wait(self) -> str:
        """Zset session → unix ms it started waiting for a free Substrate worker (the fair queue)."""
        return f"{self.prefix}capacity:wait"

    @property
    def capacity_told(self) -> str:
        """Zset session → unix ms it was told a freed Substrate worker is its own (a waiter in
        capacity:wait that now asks Substrate; see capacity_tell.lua)."""
        return f"{self.prefix}capacity:told"

    @property
    def parking(self) -> str:
        """Zset session → unix ms a pressure park of it was requested (parks in flight)."""
        return f"{self.prefix}capacity:parking"

    @property
    def parks(self) -> str:
        """Zset park job id → unix ms it parked a session (the last minute's, for parks/minute)."""
        return f"{self.prefix}capacity:parks"

    @property
    def capacity_workers(self) -> str:
        """Hash: Substrate workers total/busy/free and when (`at`, unix ms), from ListWorkers."""
        return f"{self.prefix}capacity:workers"

    @property
    def done_channel(self) -> str:
        """Pub/sub channel: `<job id> <state>[ res|err <json>]` on every terminal transition (JobWaiter)."""
        return f"{self.prefix}ch:done"

    @property
    def cancel_channel(self) -> str:
        """Pub/sub channel: `<job id>` when a running job is asked to cancel (for Consumer)."""
        return f"{self.prefix}ch:cancel"

    @property
    def told_channel(self) -> str:
        """Pub/sub channel: `<session>` when a waiter of another worker process is told a freed
        Substrate worker is its own (common.capacity)."""
        return f"{self.prefix}ch:told"

    @property
    def reconciler_leader(self) -> str:
        """String with PX TTL: `<instance>:<epoch>` of the active reconciler."""
        return f"{self.prefix}reconciler:leader"

    @property
    def reconciler_epoch(self) -> str:
        """Counter: the fencing epoch handed to each new reconciler leader."""
        return f"{self.prefix}reconciler:epoch"

    # -- per job ---------------------------------------------------------------------------------
    def job(self, job_id: str) -> str:
        """Hash: the job record; TTL once terminal (compacted then: payload dropped, small output
        folded in as `o`)."""
        return f"{self.prefix}job:{job_id}"

    def output(self, job_id: str) -> str:
        """Stream, capped: output chunks and a final end marker, for output that outlasts the
        worker's hold (`jobs.output_hold_s`); TTL `jobs.output_ttl_s` once the job ends."""
        return f"{self.prefix}out:{job_id}"

    def secrets(self, job_id: str) -> str:
        """String (JSON): per-call secret env vars, kept while the job lives (retries read them
        again), deleted at any terminal state; TTL `jobs.ttl_s` as a backstop."""
        return f"{self.prefix}sec:{job_id}"

    # -- per worker ------------------------------------------------------------------------------
    def inbox(self, worker_id: str) -> str:
        """List: sessions handed to the worker (JSON: session, epoch, head job fields), which it
        is blocked on; an empty entry only wakes it."""
        return f"{self.prefix}inbox:{worker_id}"

    # -- per session -----------------------------------------------------------------------------
    def fifo(self, session: str) -> str:
        """List: the session's FIFO of job ids (head = running or next)."""
        return f"{self.prefix}sq:{{{session}}}"

    def session(self, session: str) -> str:
        """Hash: queue bookkeeping (`epoch`, `nid`) plus the fields the worker maintains."""
        return f"{self.prefix}sess:{{{session}}}"

    def lease(self, session: str) -> str:
        """String with PX TTL: `<worker>:<epoch>` of the session's owner."""
        return f"{self.prefix}lease:{{{session}}}"

    def idempotency(self, principal: str, key: str) -> str:
        """String with PX TTL: `<job id> <fingerprint>`."""
        return f"{self.prefix}idem:{principal}:{key}"

    # -- per principal (tenancy: api/ownership.py, api/quotas.py) --------------------------------
    def owned_sessions(self, principal: str) -> str:
        """Set of the sessions (`env/sid`) the principal owns, until GC forgets them."""
        return f"{self.prefix}owned:{principal}"

    def principal_jobs(self, principal: str) -> str:
        """Zset job id → enqueue ms: the principal's jobs, pruned of ended ones near its quota."""
        return f"{self.prefix}pjobs:{principal}"

    def output_bytes(self, principal: str) -> str:
        """Counter with PX TTL (`jobs.ttl_s` from its first byte): output bytes the principal's
        jobs streamed in that window, which is as long as their output is kept."""
        return f"{self.prefix}obytes:{principal}"

    def session_index(self, environment: str) -> str:
        """Zset (all scores 0) of the environment's session ids, for listing by lexical cursor."""
        return f"{self.prefix}sessions:{environment}"

    # -- fleet statistics (common/fleet_stats.py, folded from `events` by the reconciler) --------
    def stats_bucket(self, start_s: int) -> str:
        """Hash, TTL'd: counters of the 10 s from `start_s` (jobs by end state, latency histogram, drifts)."""
        return f"{self.prefix}stats:s:{start_s}"

    @property
    def stats_cursor(self) -> str:
        """String: the id of the last `events` entry folded into the counters."""
        return f"{self.prefix}stats:cursor"

    @property
    def stats_sessions(self) -> str:
        """Hash: session count by state (and `at`, unix ms), refreshed by the stats pass."""
        return f"{self.prefix}stats:sessions"

    @property
    def recent_jobs(self) -> str:
        """Zset job id → enqueue ms: the fleet's most recent jobs (capped), for job search."""
        return f"{self.prefix}stats:jobs"

    def session_jobs(self, session: str) -> str:
        """Zset job id → enqueue ms: the session's most recent jobs (capped, TTL'd)."""
        return f"{self.prefix}stats:sjobs:{{{session}}}"

    def session_drifts(self, session: str) -> str:
        """List, capped and TTL'd: the session's drift events (JSON), newest first."""
        return f"{self.prefix}stats:drifts:{{{session}}}"

    def lua_prelude(self) -> str:
        """Lua: the pub/sub channels, and a builder for each kind of key some script computes
        (`job_key(jid)`, `sess_key(session)`, ...; named like `common.redis.scripts.KINDS`).

        A script gets the keys its caller names as declared KEYS; the builders are for the keys it
        can only compute from data it reads (a job id from a FIFO, a worker from `idle`), which
        `common.redis.scripts.COMPUTED_KEYS` lists per script.
        """
        p = _lua_string(self.prefix)
        return (
            f"local CH_DONE = {_lua_string(self.done_channel)}\n"
            f"local CH_CANCEL = {_lua_string(self.cancel_channel)}\n"
            f"local function job_key(j) return {p} .. 'job:' .. j end\n"
            f"local function out_key(j) return {p} .. 'out:' .. j end\n"
            f"local function sec_key(j) return {p} .. 'sec:' .. j end\n"
            f"local function fifo_key(s) return {p} .. 'sq:{{' .. s .. '}}' end\n"
            f"local function sess_key(s) return {p} .. 'sess:{{' .. s .. '}}' end\n"
            f"local function lease_key(s) return {p} .. 'lease:{{' .. s .. '}}' end\n"
            f"local function inbox_key(w) return {p} .. 'inbox:' .. w end\n"
            f"local function owned_key(pr) return {p} .. 'owned:' .. pr end\n"
            f"local function obytes_key(pr) return {p} .. 'obytes:' .. pr end\n"
        )


def _lua_string(value: str) -> str:
    """A Lua string literal for `value` (prefixes are plain, but quote defensively)."""
    escaped = value.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"
