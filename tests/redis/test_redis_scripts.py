"""The script registry: headers parsed into KEYS, every key a script touches declared or listed as
computed, and scripts Redis forgot loaded again, for the queue's and the reconciler's alike."""

from __future__ import annotations

import asyncio
import re
from importlib import resources

import pytest
import redis.asyncio as aioredis

from common.capacity import Capacity
from common.config import Config, parse_config
from common.queue import JobKind, NewJob, Queue
from common.queue.keys import Keys
from common.redis.client import RedisClient
from common.redis.link import Encoded
from common.redis.scripts import (
    COMPUTED_KEYS,
    SCRIPT_HOMES,
    Declared,
    LuaScript,
    ScriptHeaderError,
    ScriptRunner,
    load_script,
)
from reconciler.store import ReconcilerStore

KEYS = Keys("t:")

_LIB_FUNCTION = re.compile(r"^local function (\w+)\(.*?^end$", re.MULTILINE | re.DOTALL)
_CALL = re.compile(r"\b(\w+)\(")
_LOCAL_KEY = re.compile(r"\bK_[A-Z_]+\b")
_BUILDER = re.compile(r"\b(\w+)_key\(")


def _scripts() -> list[tuple[str, str, str]]:
    """(home, name, body) of every script of the fleet."""
    found = []
    for home in SCRIPT_HOMES:
        for path in sorted(resources.files(home).joinpath("lua").iterdir(), key=lambda p: p.name):
            if path.name.endswith(".lua") and path.name != "_lib.lua":
                found.append((home, path.name.removesuffix(".lua"), path.read_text()))
    return found


def _code(lua: str) -> str:
    return re.sub(r"--[^\n]*", "", lua)


def _lib_functions(home: str) -> dict[str, str]:
    lib = resources.files(home).joinpath("lua", "_lib.lua")
    return {m[1]: _code(m[0]) for m in _LIB_FUNCTION.finditer(lib.read_text())} if lib.is_file() else {}


def _reachable(body: str, lib: dict[str, str]) -> str:
    """The script's code and that of every _lib.lua function it reaches."""
    seen: set[str] = set()
    todo = [body]
    code = []
    while todo:
        text = todo.pop()
        code.append(text)
        for name in set(_CALL.findall(text)) & set(lib) - seen:
            seen.add(name)
            todo.append(lib[name])
    return "\n".join(code)


def test_a_header_declares_keys_in_order_and_names_them_in_lua() -> None:
    # given a header with fleet-wide keys, keys of the call's subjects, and per-item keys
    body = ("--! keys: events work\n--! keys of (s, j): lease(s) job(j)\n"
            "--! keys each (pr, idem): pjobs(pr) idem(idem)\nreturn 1\n")
    declared = Declared.parse("t", body)
    script = LuaScript("t", declared.lua() + body, declared, KEYS)
    # then a call passes exactly those keys, in the header's order, built by Keys
    count, args = script.keys(("e/s", "j1"), [("p1", ("p1", "k1")), ("p2", ("p2", "k2"))])
    names = [a for arg in args for a in (arg.args if isinstance(arg, Encoded) else (arg,))]
    assert names == ["t:events", "t:work", "t:lease:{e/s}", "t:job:j1", "t:pjobs:p1", "t:idem:p1:k1",
                     "t:pjobs:p2", "t:idem:p2:k2"]
    assert count == len(names)
    # and the script sees each as a local, per-item ones through each_keys(i)
    lua = declared.lua()
    assert "local K_EVENTS = KEYS[1]\n" in lua and "local K_JOB = KEYS[4]\n" in lua
    assert "local b = 4 + 2 * (i - 1) return {pjobs = KEYS[b + 1], idem = KEYS[b + 2]}" in lua


@pytest.mark.parametrize("header", [
    "--! keys: events nosuch",              # not a fleet-wide key
    "--! keys of (s): lease(s) bogus(s)",   # not a kind of key
    "--! keys of (s, j): lease(s)",         # a subject without a key
    "--! keys of (s): lease(x)",            # a key of an undeclared subject
    "--! keys of (s): lease(s) lease(s)",   # the same local twice
    "--! keys: events\n--! keys: work",     # two lines of one group
])
def test_a_header_that_cannot_be_used_is_refused(header: str) -> None:
    with pytest.raises(ScriptHeaderError):
        Declared.parse("bad", header + "\nreturn 1\n")


@pytest.mark.parametrize(("home", "name", "body"), [pytest.param(*s, id=s[1]) for s in _scripts()])
def test_every_key_a_script_touches_is_declared_or_listed_as_computed(home: str, name: str,
                                                                      body: str) -> None:
    declared = Declared.parse(name, body)
    code = _reachable(_code(body), _lib_functions(home))
    # every key local it (or a helper it calls) reads is declared, and every declared one is read
    declared_locals = set(_LOCAL_KEY.findall(declared.lua()))
    assert set(_LOCAL_KEY.findall(code)) == declared_locals
    assert ("each_keys(" in code) == bool(declared.each)
    assert all(re.search(rf"\.{field}\b", code) for field in declared.each_fields)
    # no KEYS by position: only through the names the header gives
    assert "KEYS[" not in code
    # the key names it builds itself are exactly those COMPUTED_KEYS lists (from data it reads)
    assert set(_BUILDER.findall(code)) == set(COMPUTED_KEYS.get(name, {}))


def test_every_script_loads_and_computed_keys_name_only_real_scripts() -> None:
    names = {name for _, name, _ in _scripts()}
    assert set(COMPUTED_KEYS) <= names
    for home, name, _ in _scripts():
        assert load_script(home, name, KEYS).sha


@pytest.fixture
def config() -> Config:
    return parse_config({})


async def test_scripts_forgotten_by_redis_are_loaded_again(redis_client: aioredis.Redis,
                                                          fleet_redis: RedisClient, config: Config) -> None:
    # given the queue's, the reconciler's and the capacity scripts, each run once
    queue = Queue(fleet_redis, config)
    store = ReconcilerStore(fleet_redis, queue.keys)
    capacity = Capacity(fleet_redis, config)
    await queue.enqueue(NewJob("env", "s0", JobKind.TOOL, {}, "tester"))
    assert (await store.leader_acquire("me", 10_000))[0]
    assert (await capacity.turn("env/s0")).rank == 0
    # when Redis forgets every script (a restart, SCRIPT FLUSH)
    await redis_client.script_flush()
    # then calls, many at once, load them again and run
    results = await asyncio.gather(
        *(queue.enqueue(NewJob("env", f"s{i}", JobKind.TOOL, {}, "tester")) for i in range(1, 11)))
    assert all(r.created for r in results)
    await redis_client.script_flush()
    assert await store.leader_renew((await store.leader_value()) or "", 10_000)
    await redis_client.script_flush()
    assert (await capacity.turn("env/s1")).rank == 0


async def test_a_runner_loads_a_forgotten_script_once_per_call(redis_client: aioredis.Redis,
                                                                fleet_redis: RedisClient) -> None:
    script = load_script("reconciler", "leader_renew", KEYS)
    runner = ScriptRunner(fleet_redis.execute)
    assert await runner.call(script, args=["nobody", 1000]) == 0
    await redis_client.script_flush()
    assert await redis_client.script_exists(script.sha) == [False]
    assert await runner.call(script, args=["nobody", 1000]) == 0
    assert await redis_client.script_exists(script.sha) == [True]
