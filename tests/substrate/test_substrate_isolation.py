"""Sandbox isolation, for each level (bwrap and unshare), checked with commands run the way an
agent's commands run: through the real guest's bash tool inside the actor. Every test here also
passes with the fleet as a normal user (marked `non_root`: CI runs them as one), where the
unshare level does not exist and per-slot uids are not available."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from common.embedded_redis import EmbeddedRedis
from common.guest_client import ActorMismatch, GuestClient, GuestUnavailable
from common.routing import LocalGuestRouter
from common.substrate import Actor, ActorStatus, SubstrateClient, Unauthenticated
from local_substrate import slots
from local_substrate.sandbox import (
    ETC_ENTRIES,
    ETC_GENERATED,
    SandboxUnavailable,
    detect_level,
    nproc_counted_per_sandbox,
)
from local_substrate.slots import UID_BLOCK, UID_BLOCKS, claim_uid_block
from tests.conftest import SANDBOX_LEVELS
from tests.substrate.conftest import ATESPACE, UNSANDBOXED, Harness, Start, start_harness, substrate_config

pytestmark = pytest.mark.non_root

LEVELS = SANDBOX_LEVELS
LIMITED = {"name": "default-env-template", "limits": {"memory_mb": 256, "max_pids": 64}}
ROOT = os.geteuid() == 0


async def _two_actors(start_substrate: Start, level: str) -> tuple[Harness, Actor, Actor]:
    # Not kept frozen: a suspend here must end every process of the sandbox.
    h = await start_substrate(slots=2, frozen_max=0, sandbox=level, templates=[LIMITED])
    assert h.server.level == level
    await h.actor("a")
    await h.actor("b")
    a = await h.client.resume_actor(ATESPACE, "a")
    b = await h.client.resume_actor(ATESPACE, "b")
    return h, a, b


def _absent(paths: list[Path | str]) -> str:
    return "; ".join(f"if test -e {p}; then echo VISIBLE {p}; fi" for p in paths)


@pytest.mark.parametrize("level", LEVELS)
async def test_fleet_state_and_other_sessions_are_invisible(
    start_substrate: Start, level: str, redis_server: EmbeddedRedis, repo_root: Path
) -> None:
    h, a, b = await _two_actors(start_substrate, level)
    secret = uuid.uuid4().hex
    await h.bash(a, f"echo {secret} > mine.txt")
    slot_a = h.server.layout.slot_dir(a.pod_name)
    hidden = [
        slot_a / "workspace" / "mine.txt",  # the other session's workspace
        h.server.layout.snapshots,  # the snapshot store
        h.server.layout.db,
        Path(h.config.state_dir),
        repo_root / "pyproject.toml",  # the repo root (config.yaml lives there)
        repo_root / ".state",
        redis_server.data_dir,  # the fleet's Redis data
        h.server.layout.token,  # the gRPC credential
        h.server.layout.socket_dir(a.pod_name),  # the guests' sockets
        "/etc/shadow",
        "/etc/hostname",
        "/etc/machine-id",
        "/run/atefleet",
    ]
    out = await h.bash(
        b, _absent(hidden) + f"; grep -rl {secret} /tmp /workspace /var /run /opt /work 2>/dev/null; echo end"
    )
    assert out["stdout"] == "end\n"
    # writable: only the workspace, the guest state dir and /tmp
    dirs = "/ /usr /etc /opt/atefleet/guest /opt/atefleet/site-packages /work /run"
    probe = f"for d in {dirs}; do touch $d/x 2>/dev/null && echo WROTE $d; done"
    out = await h.bash(b, probe + "; touch /workspace/x /tmp/x /var/lib/atefleet-guest/x && echo ok")
    assert out["stdout"] == "ok\n"


@pytest.mark.parametrize("level", LEVELS)
async def test_host_loopback_services_are_unreachable(
    start_substrate: Start, level: str, redis_server: EmbeddedRedis
) -> None:
    h, a, _ = await _two_actors(start_substrate, level)
    substrate_port = int(h.server.address.rpartition(":")[2])
    for port in (redis_server.port, substrate_port):
        code = (
            f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('CONNECTED')"
        )
        out = await h.bash(a, f'python3 -c "{code}" 2>&1 | tail -1')
        assert "CONNECTED" not in out["stdout"] and "refused" in out["stdout"].lower()


@pytest.mark.parametrize("level", LEVELS)
async def test_ps_shows_only_its_own_processes(start_substrate: Start, level: str) -> None:
    h, a, _ = await _two_actors(start_substrate, level)
    out = await h.bash(a, "ps -e -o uid=,comm=")
    rows = [line.split() for line in out["stdout"].splitlines()]
    uids = {int(r[0]) for r in rows}
    slot_uid = h.server.control.slots.get(a.pod_name).uid  # type: ignore[union-attr]
    assert uids <= ({0, slot_uid} if ROOT else {os.getuid()})
    assert len(rows) <= 6, rows  # init, guest, the shell, ps


@pytest.mark.parametrize("level", LEVELS)
async def test_fork_bomb_and_memory_hog_are_contained(start_substrate: Start, level: str) -> None:
    if not ROOT:
        pytest.skip("as a normal user every sandbox runs as the fleet's uid, and this test counts the bombed "
                    "sandbox's processes by its uid (a uid per slot needs root)")
    h, a, b = await _two_actors(start_substrate, level)
    # given a memory hog: it fails inside the sandbox, the guest keeps serving
    out = await h.bash(a, "python3 -c 'x = bytearray(1 << 30)' 2>&1 | tail -1")
    assert "MemoryError" in out["stdout"]
    # given a fork bomb in the background (setsid: the guest ends a command's process group
    # when the command returns), then it runs into the process limit
    # (every process forks forever and survives failed forks, so the limit stays hit)
    bomb = "import os, time\nwhile True:\n  try: os.fork()\n  except OSError: time.sleep(0.01)"
    await h.bash(a, f"printf '{bomb}' > /tmp/b.py; setsid python3 /tmp/b.py >/dev/null 2>&1 < /dev/null &")
    uid = h.server.control.slots.get(a.pod_name).uid  # type: ignore[union-attr]
    await _until_tasks(uid, LIMITED["limits"]["max_pids"] - 8)  # type: ignore[index]
    # then the host and the other session stay healthy
    assert subprocess.run(["true"]).returncode == 0
    assert (await h.bash(b, "echo alive"))["stdout"] == "alive\n"
    # and suspending the bombed actor clears every one of its processes
    assert (await h.client.suspend_actor(ATESPACE, "a")).status is ActorStatus.SUSPENDED
    deadline = asyncio.get_running_loop().time() + 10
    while left := _slot_processes(uid):
        assert asyncio.get_running_loop().time() < deadline, f"left running: {_describe(left)}"
        await asyncio.sleep(0.02)


def _describe(pids: list[int]) -> list[str]:
    """What each process is (state, parent, pid namespace, command line), to tell why it lives."""
    out = []
    for pid in pids[:10]:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ns = os.readlink(f"/proc/{pid}/ns/pid")
        except OSError:
            continue
        state, ppid = stat[stat.rfind(")") + 2 :].split()[:2]
        out.append(f"{pid} {state} ppid={ppid} {ns} {cmd[:80]!r}")
    return out


def _slot_processes(uid: int) -> list[int]:
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        uid_line = next((line for line in text.splitlines() if line.startswith("Uid:")), "")
        if uid_line.split()[1:2] == [str(uid)]:
            pids.append(int(status.parent.name))
    return pids


def _tasks(pids: list[int]) -> int:
    return sum(len(list(Path(f"/proc/{p}/task").glob("*"))) for p in pids)


async def _until_tasks(uid: int, count: int, timeout_s: float = 20.0) -> None:
    """Until the sandbox uid runs about as many tasks as its limit allows: the bomb hit it."""
    async with asyncio.timeout(timeout_s):
        while _tasks(_slot_processes(uid)) < count:
            await asyncio.sleep(0.05)


async def test_network_host_is_refused_without_auth(start_substrate: Start) -> None:
    with pytest.raises(RuntimeError, match="network: host.*configure auth"):
        await start_substrate(slots=1, templates=[{"name": "default-env-template", "network": "host"}])


async def test_network_host_reaches_the_port_but_not_the_control_plane(start_substrate: Start) -> None:
    h = await start_substrate(slots=1, templates=[{"name": "default-env-template", "network": "host"}],
                              auth={"api_keys": [{"name": "k", "sha256": "0" * 64}]})
    await h.actor("n")
    actor = await h.client.resume_actor(ATESPACE, "n")
    port = int(h.server.address.rpartition(":")[2])
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('CONNECTED')"
    assert (await h.bash(actor, f'python3 -c "{code}"'))["stdout"] == "CONNECTED\n"
    # the port answers only with the token, which no sandbox can read
    out = await h.bash(actor, f"cat {h.server.layout.token} 2>&1 || echo unreadable")
    assert out["stdout"].endswith("unreadable\n")


async def test_calls_without_the_token_are_refused(start_substrate: Start, tmp_path: Path) -> None:
    h = await start_substrate(slots=1)
    async with SubstrateClient(h.server.address, retry_attempts=1) as anonymous:
        with pytest.raises(Unauthenticated):
            await anonymous.list_atespaces()
    wrong = tmp_path / "token"
    wrong.write_text("not-the-token")
    async with SubstrateClient(h.server.address, retry_attempts=1, token_file=str(wrong)) as forged:
        with pytest.raises(Unauthenticated):
            await forged.create_atespace("x")
    assert h.server.layout.token.stat().st_mode & 0o777 == 0o600


async def test_template_skills_are_mounted_read_only_at_the_environments_path(
    start_substrate: Start, tmp_path: Path
) -> None:
    skills = tmp_path / "skills" / "greet"
    skills.mkdir(parents=True)
    (skills / "SKILL.md").write_text("# greet\n")
    h = await start_substrate(
        slots=1,
        templates=[{"name": "skilled", "skills_dir": str(skills.parent)}],
        environments=[{"name": "sk", "template": "skilled", "skills_dir": "/opt/skills"}],
    )
    await h.actor("k", "skilled")
    actor = await h.client.resume_actor(ATESPACE, "k")
    out = await h.bash(
        actor, "cat /opt/skills/greet/SKILL.md; touch /opt/skills/x 2>/dev/null || echo read-only"
    )
    assert out["stdout"] == "# greet\nread-only\n"


async def test_without_a_sandbox_guests_still_run_and_the_level_says_so(start_substrate: Start) -> None:
    h = await start_substrate(slots=1, sandbox="none", templates=[UNSANDBOXED])
    assert h.server.level == "none"
    status = json.loads(h.server.layout.status.read_text())
    assert status["sandbox"] == "none" and status["slots"] == 1
    assert status["isolation"]["sandbox"] == "none"
    assert any("no sandbox" in line for line in status["isolation"]["gives_up"])
    await h.actor("plain")
    actor = await h.client.resume_actor(ATESPACE, "plain")
    assert (await h.bash(actor, "echo hi > f.txt && cat f.txt"))["stdout"] == "hi\n"


@pytest.mark.needs_bwrap
async def test_sandboxes_share_one_cpu_weight(start_substrate: Start) -> None:
    """Every process of every sandbox runs under the server's one weighted cpu group."""
    h = await start_substrate(slots=2, sandbox="bwrap", templates=[LIMITED], sandbox_cpu_weight=25)
    if h.server.control.cgroups.mode != "v1" or not Path("/sys/fs/cgroup/cpu").is_dir():
        pytest.skip("checked on cgroup v1 with a cpu controller (this machine's); v2 writes cpu.weight")
    await h.actor("a")
    a = await h.client.resume_actor(ATESPACE, "a")
    await h.bash(a, "sleep 30 > /dev/null 2>&1 < /dev/null &")
    uid = h.server.control.slots.get(a.pod_name).uid  # type: ignore[union-attr]
    groups = {}  # pid: (its cpu cgroup's parent, its command line), which a failure shows
    for pid in _slot_processes(uid):
        lines = (x.split(":", 2) for x in Path(f"/proc/{pid}/cgroup").read_text().splitlines())
        path = next(p for _, controllers, p in lines if "cpu" in controllers.split(","))
        groups[pid] = (path.rsplit("/", 1)[0], Path(f"/proc/{pid}/cmdline").read_bytes())
    parents = {parent for parent, _ in groups.values()}
    assert len(parents) == 1, groups
    [parent] = parents
    assert parent.startswith("/atefleet-")
    assert Path(f"/sys/fs/cgroup/cpu{parent}/cpu.shares").read_text().strip() == str(25 * 1024 // 100)


# -- a hostile tenant ---------------------------------------------------------------------------

ROGUE = "import pathlib; pathlib.Path('/workspace/PWNED').write_text('rogue code ran')"


@pytest.mark.parametrize("level", LEVELS)
async def test_a_guest_package_in_the_workspace_does_not_replace_the_guest(
    start_substrate: Start, level: str
) -> None:
    h, a, _ = await _two_actors(start_substrate, level)
    # given everything a tenant could plant for the next interpreter start: a `guest` package in
    # the workspace (the old cwd), in /tmp and the state dir, and site/user customize hooks
    files = ("guest/__init__.py", "guest/__main__.py", "sitecustomize.py", "usercustomize.py")
    targets = " ".join(f"{d}/{f}" for d in ("/workspace", "/tmp", "/var/lib/atefleet-guest") for f in files)
    plant = "for d in /workspace /tmp /var/lib/atefleet-guest; do mkdir -p $d/guest; done; "
    plant += f"printf '%s\\n' {shlex.quote(ROGUE)} | tee {targets} > /dev/null; echo planted"
    assert (await h.bash(a, plant))["stdout"] == "planted\n"
    # when the actor is suspended (the workspace is kept) and resumed
    await h.client.suspend_actor(ATESPACE, "a")
    a = await h.client.resume_actor(ATESPACE, "a")
    # then the real guest serves it, the planted code never ran, and the files are still there
    out = await h.bash(a, "test -e /workspace/PWNED && echo PWNED; cat guest/__init__.py | wc -l")
    assert out["stdout"] == "1\n"
    address = await LocalGuestRouter(h.config).address(a)
    async with GuestClient(address, actor="a") as guest:
        assert (await guest.readyz())["actor"] == "a"


@pytest.mark.parametrize("level", LEVELS)
async def test_guest_code_socket_and_memory_are_out_of_reach(start_substrate: Start, level: str) -> None:
    h, a, _ = await _two_actors(start_substrate, level)
    out = await h.bash(a, (
        "rm -rf /opt/atefleet/guest 2>/dev/null; test -e /opt/atefleet/guest/__main__.py || echo REMOVED; "
        "find / -type s -not -path '/proc/*' 2>/dev/null; "
        # (the pattern is built at run time, so this shell's own command line does not match it)
        "pat=sys.mod; pat=${pat}ules; echo pid1 $(ls -l /proc/1/fd 2>/dev/null | grep -c socket); "
        "for p in /proc/[2-9]* /proc/1[0-9]*; do if grep -q $pat $p/cmdline 2>/dev/null; then "
        "echo guest $(ls -l $p/fd/ 2>/dev/null | grep -c socket) "
        "$(cat $p/environ > /dev/null 2>&1 && echo ENVIRON || echo closed); fi; done"))
    # then the guest's code stays, no socket is reachable by path, the launcher's pid 1 holds no
    # socket, and the guest's fds and environment are closed to the tenant's commands (the same
    # uid as a normal user, but the guest is not dumpable)
    assert out["stdout"] == "pid1 0\nguest 0 closed\n"


async def test_a_stale_address_never_reaches_the_slots_next_actor(start_substrate: Start) -> None:
    h = await start_substrate(slots=1, frozen_max=0)  # the next actor in the same slot
    await h.actor("a")
    await h.actor("b")
    a = await h.client.resume_actor(ATESPACE, "a")
    stale = await LocalGuestRouter(h.config).address(a)
    async with GuestClient(stale, actor="a") as guest:
        await guest.list_processes()
        # given the slot now runs another actor
        await h.client.suspend_actor(ATESPACE, "a")
        b = await h.client.resume_actor(ATESPACE, "b")
        assert b.pod_name == a.pod_name and b.pod_uid != a.pod_uid
        # when a's cached connection and address are used, then nothing reaches b's guest
        with pytest.raises(GuestUnavailable):
            await guest.run(uuid.uuid4().hex, "bash", {"command": "touch /workspace/from-a"})
    # and a request for a sent to b's own address is refused by b's guest
    async with GuestClient(await LocalGuestRouter(h.config).address(b), actor="a") as wrong:
        with pytest.raises(ActorMismatch):
            await wrong.run(uuid.uuid4().hex, "bash", {"command": "touch /workspace/from-a"})
    assert (await h.bash(b, "ls /workspace"))["stdout"] == ""


@pytest.mark.parametrize("level", LEVELS)
async def test_no_fleet_secret_reaches_a_sandbox(
    start_substrate: Start, level: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a local Substrate started by someone holding the fleet's secrets in its environment
    key = base64.b64encode(os.urandom(32)).decode()
    password = uuid.uuid4().hex
    monkeypatch.setenv("ATEFLEET_SECRETS_KEY", key)
    monkeypatch.setenv("ATEFLEET_REDIS_URL", f"redis://:{password}@127.0.0.1:6379/0")
    monkeypatch.setenv("OPERATOR_SECRET", password)
    h, a, _ = await _two_actors(start_substrate, level)
    # then no process of the sandbox, pid 1 included, carries any of it
    out = await h.bash(a, "for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null; done; env")
    assert key not in out["stdout"] and password not in out["stdout"]
    assert "ATEFLEET" not in out["stdout"] and "REDIS" not in out["stdout"]


@pytest.mark.parametrize("level", LEVELS)
async def test_etc_holds_only_what_programs_need(start_substrate: Start, level: str) -> None:
    h, a, _ = await _two_actors(start_substrate, level)
    out = await h.bash(a, "ls -A /etc")
    assert set(out["stdout"].split()) <= {*ETC_ENTRIES, *ETC_GENERATED}
    out = await h.bash(a, "cut -d: -f1 /etc/passwd | sort -u | tr '\\n' ' '; id -un")
    assert out["stdout"] == "nobody root sandbox sandbox\n"
    # name lookup and TLS set-up still work
    code = "import socket, ssl; socket.getaddrinfo('localhost', 80); ssl.create_default_context(); print(1)"
    assert (await h.bash(a, f'python3 -c "{code}"'))["stdout"] == "1\n"


@pytest.mark.parametrize("level", LEVELS)
async def test_dev_shm_is_bounded(start_substrate: Start, level: str) -> None:
    h, a, _ = await _two_actors(start_substrate, level)
    # LIMITED has memory_mb 256: /dev/shm holds at most a quarter of it
    out = await h.bash(a, "head -c 100M /dev/zero 2>&1 > /dev/shm/fill; du -m /dev/shm/fill | cut -f1")
    assert "No space left" in out["stdout"] and int(out["stdout"].split()[-1]) <= 64


async def test_auto_never_falls_back_to_no_sandbox(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # given a machine where neither bwrap nor unshare can be found
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap") as err:
        detect_level("auto")
    assert "sandbox: none" in str(err.value)  # the way to opt out, by name
    assert detect_level("none") == "none"


@pytest.mark.parametrize("level", LEVELS)
async def test_status_states_the_isolation_in_force(start_substrate: Start, level: str) -> None:
    h = await start_substrate(slots=1, sandbox=level)
    report = json.loads(h.server.layout.status.read_text())["isolation"]
    mode = h.server.control.cgroups.mode  # type: ignore[union-attr]
    assert report["sandbox"] == level and report["per_slot_uids"] is ROOT
    assert report["cgroups"] == (None if mode == "none" else mode)
    assert "/dev/shm" in report["memory"]
    assert any("per-slot uid" in line for line in report["gives_up"]) is not ROOT
    assert report["nproc_per_sandbox"] is nproc_counted_per_sandbox(level)
    shared_nproc = any("RLIMIT_NPROC counts" in line for line in report["gives_up"])
    assert shared_nproc is not report["nproc_per_sandbox"]


async def test_where_the_probe_says_so_a_sandboxs_process_limit_counts_only_its_own(
        start_substrate: Start) -> None:
    """What lets a normal user's fleet keep sandboxes frozen: with this uid running more tasks
    than a sandbox's `max_pids`, a process in the sandbox can still fork."""
    if not nproc_counted_per_sandbox("bwrap"):
        pytest.skip("RLIMIT_NPROC counts this uid as a whole here (a kernel before 5.14, not root)")
    h, a, _ = await _two_actors(start_substrate, "bwrap")
    limit = LIMITED["limits"]["max_pids"]  # type: ignore[index]
    done = threading.Event()
    held = [threading.Thread(target=done.wait, daemon=True) for _ in range(limit + 8)]
    for t in held:
        t.start()
    try:
        out = await h.bash(a, "grep 'Max processes' /proc/self/limits; (echo forked) | cat")
    finally:
        done.set()
        for t in held:
            t.join()
    assert out["stdout"].split()[2:4] == [str(limit), str(limit)] and out["stdout"].endswith("\nforked\n")


@pytest.mark.parametrize("level", LEVELS)
async def test_a_sandbox_is_the_oom_killers_first_choice_and_cannot_change_that(
    start_substrate: Start, level: str
) -> None:
    h = await start_substrate(slots=1, sandbox=level)
    await h.actor("oom")
    a = await h.client.resume_actor(ATESPACE, "oom")
    out = await h.bash(a, "cat /proc/self/oom_score_adj; echo -9 > /proc/self/oom_score_adj && echo lowered")
    assert out["stdout"] == "1000\n"
    assert Path("/proc/self/oom_score_adj").read_text().strip() != "1000"  # the fleet's own processes


@pytest.mark.parametrize("level", LEVELS)
async def test_the_tenants_python_keeps_ssl(start_substrate: Start, level: str) -> None:
    # (the guest's interpreter starts with ssl unimportable: it serves plain HTTP on a unix socket)
    h, a, _ = await _two_actors(start_substrate, level)
    # when the tenant's own Python imports ssl, then it can: its commands are other processes
    out = await h.bash(a, "python3 -c 'import ssl; print(ssl.OPENSSL_VERSION.split()[0])'")
    assert out["stdout"] == "OpenSSL\n", out


async def test_local_substrates_whose_state_dirs_hash_alike_get_their_own_uids() -> None:
    if not ROOT:
        pytest.skip("per-slot uids need root: as a normal user every sandbox runs as the fleet's uid")
    # given two state dirs whose paths hash to the same uid block
    base = Path(tempfile.mkdtemp(prefix="uids-", dir="/tmp"))
    try:
        def block(d: Path) -> int:
            return int(hashlib.sha256(str(d / "local-substrate").encode()).hexdigest()[:8], 16) % UID_BLOCKS

        first = base / "0"
        second = next(d for d in (base / str(i) for i in range(1, 100_000)) if block(d) == block(first))
        # when a local Substrate serves from each at once
        one = await start_harness(substrate_config(first, slots=1))
        two = await start_harness(substrate_config(second, slots=1))
        try:
            uids = []
            for h in (one, two):
                await h.actor("a")
                actor = await h.client.resume_actor(ATESPACE, "a")
                uids.append(int((await h.bash(actor, "id -u"))["stdout"]))
            # then their sandboxes run as different uids (no shared process budget, no shared kill)
            assert uids[0] != uids[1]
            assert [_status(h)["uid_first"] + 1 for h in (one, two)] == uids
        finally:
            await two.close()
            await one.close()
        # and the first keeps its block across a restart (its files keep their owners)
        again = await start_harness(substrate_config(first, slots=1))
        try:
            assert _status(again)["uid_first"] + 1 == uids[0]
        finally:
            await again.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_uid_block_is_claimed_without_the_processes_an_earlier_server_left_running(tmp_path: Path) -> None:
    if not ROOT:
        pytest.skip("per-slot uids need root: as a normal user every sandbox runs as the fleet's uid")
    # given a process still running as a uid of the block a state dir gets (a sandbox that outlived
    # its server), and one running as the uid just below the block
    block = claim_uid_block(tmp_path)
    block.release()

    def sleeper(uid: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                                 "sleep", "300"])  # fmt: skip

    leftover, bystander = sleeper(block.slot(3)), sleeper(block.first - 1)
    try:
        for p, uid in ((leftover, block.slot(3)), (bystander, block.first - 1)):
            while f"\t{uid}\t" not in Path(f"/proc/{p.pid}/status").read_text():
                time.sleep(0.001)  # setpriv has not changed its uid yet
        # when a server claims that block again
        again = claim_uid_block(tmp_path)
        again.release()
        # then the leftover is gone, and the bystander runs on
        assert again.first == block.first
        assert leftover.wait(5) == -signal.SIGKILL
        assert bystander.poll() is None
    finally:
        for p in (leftover, bystander):
            p.kill()
            p.wait()


def test_a_uid_block_the_host_gave_out_is_never_claimed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not ROOT:
        pytest.skip("per-slot uids need root: as a normal user every sandbox runs as the fleet's uid")
    # given a host whose users' rootless containers hold the uids a state dir's block would have
    hashed = claim_uid_block(tmp_path)
    hashed.release()
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "subuid").write_text(f"# rootless containers\nalice:{hashed.first - 100}:65536\n")
    (etc / "passwd").write_text(f"bob:x:{hashed.first + 65536}:100::/home/bob:/bin/sh\nbad line\n")
    monkeypatch.setattr(slots, "ETC", etc)
    # when a server claims a block for that state dir
    block = claim_uid_block(tmp_path)
    block.release()
    # then none of its uids is one the host gave out
    taken = {*range(hashed.first - 100, hashed.first - 100 + 65536), hashed.first + 65536}
    assert block.first != hashed.first
    assert not taken & set(range(block.first, block.first + UID_BLOCK))


def _status(h: Harness) -> dict[str, Any]:
    return json.loads(h.server.layout.status.read_text())  # type: ignore[no-any-return]
