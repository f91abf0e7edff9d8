"""Every Lua script of the fleet: the keys it declares, its source, and the one way it is called.

A script lives in a `lua/` directory next to the Python that calls it (`SCRIPT_HOMES`) and its
header declares the keys it takes; the registry parses that and builds the names with
`common.queue.keys.Keys`, so every call passes exactly the KEYS declared, then ARGV:

    --! keys: events work                   fleet-wide keys (`Keys` properties), built once
    --! keys of (s, j): lease(s) job(j)     keys of the call's subjects (a session, a job id)
    --! keys each (s): sess(s)              the same for each item of a list (one group per item)

KEYS holds them in that order. In the script each is a local, `K_EVENTS`, `K_LEASE`, ...;
`each_keys(i)` returns item i's as a table (`.sess`). A subject key's kind (`KINDS`) is also the
name of its Lua builder (`sess_key(s)`, from `Keys.lua_prelude`), which a script uses only for a
key it computes from data it reads: no caller could declare that key. Those keys are what stands
between the fleet and Redis Cluster (docs/scaling.md), so `COMPUTED_KEYS` lists every one, per
script, with the data it comes from; tests/redis/test_redis_scripts.py checks that the scripts
compute no other key and touch no undeclared one.

Calls go out as EVALSHA through `ScriptRunner`, the one place that loads a script Redis forgot
(restart, SCRIPT FLUSH).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError

from common.redis.link import Encoded, RedisArg

if TYPE_CHECKING:
    from common.queue.keys import Keys

#: Packages whose `lua/` directory holds scripts (every `.lua` there but `_lib.lua`).
SCRIPT_HOMES = ("common.queue", "reconciler", "common")

#: Kinds of subject keys a header may declare → the `Keys` method that builds one. `idem` takes a
#: (principal, key) pair; `key` is a name passed as found (the GC's SCAN results).
KINDS = {
    "job": "job", "out": "output", "sec": "secrets", "inbox": "inbox", "fifo": "fifo",
    "sess": "session", "lease": "lease", "idem": "idempotency", "index": "session_index",
    "owned": "owned_sessions", "pjobs": "principal_jobs", "obytes": "output_bytes", "key": "",
}
#: Fleet-wide keys a header may declare (`Keys` properties; `K_<NAME>` in the script).
FLEET_KEYS = frozenset({
    "ready", "idle", "idle_until", "events", "callbacks", "audit", "dlq", "delayed", "active",
    "work", "running", "parked", "capacity_wait", "capacity_told", "parking", "reconciler_leader",
    "reconciler_epoch",
})


def _sessions(source: str) -> dict[str, str]:
    return {kind: f"sessions read from {source}" for kind in ("fifo", "sess", "lease")}


_NOTIFY = {"inbox": "the idle worker notify hands a session to (read from `idle`)",
           "job": "the head job notify takes (read from the session's FIFO)"}

#: Keys each script computes at run time (kind → the data the name comes from): undeclarable.
COMPUTED_KEYS: dict[str, dict[str, str]] = {
    "enqueue": {**_NOTIFY, "job": "the principal's jobs (read from pjobs) pruned near its quota, "
                                  "and the head job notify takes"},
    "take_work": {**_sessions("`ready`"), "job": "their head jobs (read from their FIFOs)"},
    "complete": {**_NOTIFY, "job": "the next job (read from the FIFO), or notify's head job"},
    "retry": _NOTIFY,
    "release": _NOTIFY,
    "retire": {**_NOTIFY, **_sessions("the worker's inbox")},
    "forget_workers": {**_NOTIFY, **_sessions("lapsed workers' inboxes"),
                       "inbox": "lapsed workers (read from `idle_until`), and notify's idle worker"},
    "repair_leases": {**_NOTIFY, **_sessions("`active`")},
    "notify_delayed": {**_NOTIFY, **_sessions("`delayed`")},
    "notify_orphans": {**_NOTIFY, **_sessions("`work`")},
    "replay_dlq": {**_NOTIFY, **_sessions("the DLQ entry"),
                   "job": "the job the DLQ entry names, and notify's head job",
                   "out": "the job the DLQ entry names"},
    "cancel": {"fifo": "the job's session (read from its record)", "sess": "the same session"},
    "append_output": {"obytes": "the job's principal (read from its record)"},
    "forget_session": {"owned": "the session's owner (read from its hash)"},
    "capacity_turn": {"lease": "sessions read from capacity:wait and running",
                      "sess": "sessions read from running", "fifo": "sessions read from running"},
    "capacity_tell": {"lease": "sessions read from capacity:wait"},
    "survey": {**_sessions("sessions:{env} (ids)")},
}

#: How calls reach Redis: `RedisClient.execute` (the pipelined link; it takes `Encoded` runs).
Send = Callable[..., Awaitable[Any]]

_DECLARATION = re.compile(r"^--! keys(?: (of|each) \(([\w, ]*)\))?:(.*)$", re.MULTILINE)
_KEY = re.compile(r"^(\w+)(?:\((\w+)\))?$")


class ScriptHeaderError(ValueError):
    """A script's key declaration cannot be used; the message names the script and the part."""


@dataclass(frozen=True)
class Declared:
    """A script's declared keys: fleet-wide names, then (kind, subject) pairs once and per item."""

    fleet: tuple[str, ...] = ()
    of_subjects: tuple[str, ...] = ()
    of: tuple[tuple[str, str], ...] = ()
    each_subjects: tuple[str, ...] = ()
    each: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, name: str, source: str) -> Declared:
        parts: dict[str, Any] = {}
        for group, subjects_text, names in _DECLARATION.findall(source):
            if (group or "fleet") in parts:
                raise ScriptHeaderError(f"{name}: two `keys{' ' + group if group else ''}` lines")
            if not group:
                parts["fleet"] = tuple(_fleet_key(name, n) for n in names.split())
                continue
            subjects = tuple(s.strip() for s in subjects_text.split(","))
            pairs = tuple(_subject_key(name, n, subjects) for n in names.split())
            if {s for _, s in pairs} != set(subjects):
                raise ScriptHeaderError(f"{name}: a subject of `keys {group}` names no key")
            parts[group], parts[f"{group}_subjects"] = pairs, subjects
        declared = cls(**parts)
        locals_ = [*(f"K_{n.upper()}" for n in declared.fleet), *(_local(k, s) for k, s in declared.of)]
        fields = declared.each_fields
        if len(set(locals_)) != len(locals_) or len(set(fields)) != len(fields):
            raise ScriptHeaderError(f"{name}: a key declared twice")
        return declared

    @property
    def each_fields(self) -> tuple[str, ...]:
        """The names of an item's keys in the table `each_keys(i)` returns."""
        return tuple(_field(k, s) for k, s in self.each)

    def lua(self) -> str:
        """The Lua that names the declared KEYS: a local per key, and `each_keys(i)`."""
        lines = [f"local K_{n.upper()} = KEYS[{i}]\n" for i, n in enumerate(self.fleet, 1)]
        base = len(self.fleet)
        lines += [f"local {_local(k, s)} = KEYS[{base + i}]\n" for i, (k, s) in enumerate(self.of, 1)]
        if self.each:
            base += len(self.of)
            fields = ", ".join(f"{field} = KEYS[b + {i}]" for i, field in enumerate(self.each_fields, 1))
            lines.append(f"local function each_keys(i) local b = {base} + {len(self.each)} * (i - 1) "
                         f"return {{{fields}}} end\n")
        return "".join(lines)


def _fleet_key(script: str, name: str) -> str:
    if name not in FLEET_KEYS:
        raise ScriptHeaderError(f"{script}: `{name}` is no fleet-wide key")
    return name


def _subject_key(script: str, text: str, subjects: tuple[str, ...]) -> tuple[str, str]:
    match = _KEY.match(text)
    if match is None or match[1] not in KINDS or match[2] not in subjects:
        raise ScriptHeaderError(f"{script}: `{text}` is no kind(subject) of {subjects}")
    return match[1], match[2]


def _local(kind: str, subject: str) -> str:
    return f"K_{_field(kind, subject).upper()}"


def _field(kind: str, subject: str) -> str:
    """A key's name in Lua: its kind, or for a name passed as found, its subject."""
    return subject if kind == "key" else kind


def _builder(keys: Keys, kind: str) -> Callable[[Any], str]:
    if kind == "key":
        return str
    if kind == "idem":
        return lambda pair: keys.idempotency(*pair)
    build: Callable[[Any], str] = getattr(keys, KINDS[kind])
    return build


#: Kinds whose subject is new at nearly every call (a job id, an idempotency key): built each
#: time. The others' subjects (a session, a principal, an environment, a worker) recur call after
#: call, so their names are kept, laid out for the wire, for the last `NAME_CACHE_SIZE` subjects:
#: a session's keys are built once for its whole turn, not once per job.
_FRESH_KINDS = frozenset({"job", "out", "sec", "idem", "key"})
NAME_CACHE_SIZE = 4096

#: A subject's keys of a run of kinds, as arguments of the call.
Names = Callable[[Any], Sequence[RedisArg]]


@functools.cache
def _names(keys: Keys, kinds: tuple[str, ...]) -> Names:
    """The names of one subject's keys of `kinds` (a run of the header), kept when they recur."""
    names = _all_of([_builder(keys, kind) for kind in kinds])
    if _FRESH_KINDS.intersection(kinds):
        return names

    @functools.lru_cache(NAME_CACHE_SIZE)
    def kept(subject: Any) -> Sequence[RedisArg]:
        return [Encoded(tuple(names(subject)))]

    return kept


def _all_of(builders: list[Callable[[Any], str]]) -> Callable[[Any], Sequence[str]]:
    """One call of each builder; runs of up to three are spelt out (half the CPU of a loop, and
    these names are built at every call)."""
    if len(builders) == 1:
        (a,) = builders
        return lambda subject: [a(subject)]
    if len(builders) == 2:
        a, b = builders
        return lambda subject: [a(subject), b(subject)]
    if len(builders) == 3:
        a, b, c = builders
        return lambda subject: [a(subject), b(subject), c(subject)]
    return lambda subject: [build(subject) for build in builders]


def _runs(keys: Keys, pairs: tuple[tuple[str, str], ...],
          subjects: tuple[str, ...]) -> tuple[tuple[Names, int], ...]:
    """(names, subject index) per run of consecutive keys of one subject."""
    runs: list[tuple[list[str], str]] = []
    for kind, subject in pairs:
        if runs and runs[-1][1] == subject:
            runs[-1][0].append(kind)
        else:
            runs.append(([kind], subject))
    return tuple((_names(keys, tuple(kinds)), subjects.index(subject)) for kinds, subject in runs)


class LuaScript:
    """One script as sent: its full source and SHA, and how to build its KEYS for a call."""

    def __init__(self, name: str, source: str, declared: Declared, keys: Keys) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()
        self.declared = declared
        fleet = tuple(getattr(keys, n) for n in declared.fleet)
        #: The fleet-wide keys, laid out for the wire once.
        self._fleet: list[RedisArg] = [Encoded(fleet)] if fleet else []
        self._fixed_count = len(fleet) + len(declared.of)
        self._of = _runs(keys, declared.of, declared.of_subjects)
        self._each = _runs(keys, declared.each, declared.each_subjects)

    def keys(self, of: Sequence[Any] = (), each: Sequence[Sequence[Any]] = ()) -> tuple[int, list[RedisArg]]:
        """(number of KEYS, KEYS as call arguments) for a call: the fleet-wide ones, those of `of`
        (the subjects, in the header's order), then those of each item of `each`."""
        keys = self._fleet.copy()
        for names, i in self._of:
            keys += names(of[i])
        for item in each:
            for names, i in self._each:
                keys += names(item[i])
        return self._fixed_count + len(each) * len(self.declared.each), keys


@functools.cache
def load_script(home: str, name: str, keys: Keys, prelude: str = "") -> LuaScript:
    """The script `<home>/lua/<name>.lua` for a fleet's `keys`: its declared keys, the builders of
    computed keys and the channels (`Keys.lua_prelude`), `prelude` (its caller's constants and
    helpers), then its body. Built once per process and arguments."""
    body = resources.files(home).joinpath("lua", f"{name}.lua").read_text()
    declared = Declared.parse(name, body)
    return LuaScript(name, declared.lua() + keys.lua_prelude() + prelude + body, declared, keys)


class ScriptRunner:
    """Runs scripts by EVALSHA over `send` (see the module docstring)."""

    def __init__(self, send: Send) -> None:
        self._send = send

    async def call(self, script: LuaScript, of: Sequence[Any] = (), each: Sequence[Sequence[Any]] = (),
                   args: Sequence[RedisArg] = ()) -> Any:
        """The script's reply, or its error as `send` raises it."""
        count, keys = script.keys(of, each)
        try:
            return await self._send("EVALSHA", script.sha, count, *keys, *args)
        except NoScriptError:
            # A restarted Redis (or SCRIPT FLUSH) forgot it: load it (idempotent), call again.
            await self._send("SCRIPT", "LOAD", script.source)
            return await self._send("EVALSHA", script.sha, count, *keys, *args)

    async def load(self, scripts: Iterable[LuaScript]) -> None:
        """Load scripts now (else each is loaded at its first NOSCRIPT)."""
        for script in scripts:
            await self._send("SCRIPT", "LOAD", script.source)
