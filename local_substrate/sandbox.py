"""Sandboxes for actors: bubblewrap, else `unshare` + chroot; plain processes only when asked.

Inside a sandbox (bwrap and unshare levels):
- own mount, pid, ipc and uts namespaces, and its own network namespace holding only a loopback
  (template `network: none`, the default) or the host's network (`network: host`);
- a fresh root: system dirs (/usr and the /bin, /lib... links), of /etc only what programs need
  (ETC_ENTRIES; passwd and group are generated), the Python install read-only; of our code only
  `guest/`, `common/` and the third-party packages, read-only at /opt/atefleet; the slot's
  workspace (/workspace) and guest state dir writable; /tmp and /dev/shm size-capped tmpfs; skills
  read-only. The repo root (config.yaml, .state), the host's /etc, the snapshot store, Redis data,
  the guest's socket and other slots do not exist in it;
- an explicit minimal environment from the launcher on: the sandbox's pid 1 never carries the
  local Substrate's environment;
- as root: an unprivileged uid per slot (so one slot's RLIMIT_NPROC cannot starve another), no
  capabilities, no_new_privs; always rlimits on address space, processes, file size, open files
  and CPU; the slot's cgroup (pids + memory) when the hierarchy is writable.

The process tree is `launcher (host pid P) -> namespace init (pid 1) -> command (pid 2)`: bwrap's
own init, or for `unshare` a shell that forwards SIGTERM and reaps orphans. Stopping sends SIGTERM
to the command, waits the grace period, then SIGKILLs the namespace init, which takes every
process of the namespace with it. At the bwrap level the command is a waiter and the guest, forked
from the zygote into the sandbox's namespaces, is a tree apart (`SandboxProcess.guest`,
local_substrate/zygote.py).
"""

from __future__ import annotations

import asyncio
import compileall
import logging
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
from dataclasses import dataclass
from pathlib import Path

import common
import guest
from common.config import TemplateLimits
from local_substrate import frozen
from local_substrate.cgroups import SlotCgroup

log = logging.getLogger(__name__)

#: Where the sandbox sees our code (PYTHONPATH) and its writable dirs.
CODE_DIR = "/opt/atefleet"
WORKSPACE = "/workspace"
STATE_DIR = "/var/lib/atefleet-guest"
#: Host dirs every sandbox sees read-only (when they exist): the system, not the fleet.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: What a sandbox sees of the host's /etc (when present): what the dynamic linker, name lookup,
#: TLS, shells and the system Python need. Never the whole dir: deployments keep the fleet's
#: config there (/etc/atefleet), and shadow, ssh keys and the operator's files live there too.
ETC_ENTRIES = (
    "alternatives", "bash.bashrc", "ca-certificates", "ca-certificates.conf", "crypto-policies",
    "debian_version", "gai.conf", "host.conf", "hosts", "inputrc", "ld.so.cache", "ld.so.conf",
    "ld.so.conf.d", "locale.alias", "localtime", "magic", "mime.types", "networks",
    "nsswitch.conf", "os-release", "perl", "pki", "profile", "protocols", "python3",
    f"python3.{sys.version_info.minor}", "resolv.conf", "services", "shells", "ssl", "timezone",
)  # fmt: skip
#: /etc files a sandbox gets generated instead of the host's (which name the host's users).
ETC_GENERATED = ("passwd", "group")
#: PATH inside the sandbox.
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
#: The whole environment the launcher (bwrap, unshare) runs with: pid 1 of a sandbox shows it.
LAUNCH_ENV = {"PATH": SANDBOX_PATH, "LANG": "C.UTF-8"}
#: How long a sandbox's launcher may take to exit once its namespace init was killed (seconds).
LAUNCHER_EXIT_S = 2.0
#: oom_score_adj of every sandbox process: the highest, so the OOM killer takes them first.
OOM_SCORE_ADJ = 1000
#: /dev/shm is a tmpfs of this share of the template's memory_mb, so shared memory is bounded
#: even where no memory cgroup counts it.
SHM_SHARE = 4


@dataclass(frozen=True)
class SandboxSpec:
    """One sandbox: host dirs to expose, identity and limits."""

    hostname: str
    workspace: Path
    state: Path
    tmp: Path
    #: Empty dir used as the unshare level's new root mount point.
    root: Path
    #: Host dir mounted read-only as /etc (built by write_etc).
    etc: Path
    #: (host dir, path inside) pairs mounted read-only.
    skills: tuple[tuple[Path, str], ...]
    network: str
    limits: TemplateLimits
    uid: int
    cgroup: SlotCgroup | None
    log_path: Path


@dataclass(frozen=True)
class View:
    """The paths a command inside the sandbox uses (host paths at level "none")."""

    workspace: str
    state: str
    tmp: str
    skills: tuple[str, ...]
    #: Where our code (guest/, common/) and its third-party packages are importable from.
    code_path: tuple[str, str]


def view(level: str, spec: SandboxSpec) -> View:
    if level == "none":
        return View(
            str(spec.workspace), str(spec.state), str(spec.tmp), tuple(str(h) for h, _ in spec.skills),
            host_code_path(),
        )  # fmt: skip
    skills = tuple(inner for _, inner in spec.skills)
    return View(WORKSPACE, STATE_DIR, "/tmp", skills, (CODE_DIR, SITE_PACKAGES_DIR))


def _code_dirs() -> list[tuple[str, str]]:
    """Only guest/ and common/ of our code, never the repo root (config.yaml, .state)."""
    return [(str(Path(m.__file__ or "").parent), f"{CODE_DIR}/{m.__name__}") for m in (guest, common)]


def compile_code() -> None:
    """Write the bytecode of guest/ and common/ next to their sources.

    A sandbox sees the code read-only, so without this every guest start would compile it again
    (a third of a resume). The .pyc files stay valid inside the sandbox: validity is checked
    against the source's mtime and size, which a bind mount keeps. Best effort: a read-only
    install simply starts a little slower.
    """
    for host, _ in _code_dirs():
        try:
            compileall.compile_dir(host, quiet=2)
        except OSError as err:
            log.info("cannot precompile %s: %s", host, err)


#: Where the fleet's third-party packages appear inside a sandbox.
SITE_PACKAGES_DIR = f"{CODE_DIR}/site-packages"


def _python_dirs() -> list[str]:
    """The interpreter's own install, unless already under a system dir. The venv is not mounted
    at its host path: it may live under /tmp (a checkout there), which the sandbox's own /tmp
    hides; its packages are mounted at SITE_PACKAGES_DIR instead (see _mounted_code)."""
    base = os.path.realpath(sys.base_prefix)
    return [] if base.startswith("/usr/") else [base]


def host_code_path() -> tuple[str, str]:
    """Where our code (guest/, common/) and its third-party packages are importable from on the
    host."""
    return str(Path(guest.__file__ or "").parent.parent), sysconfig.get_path("purelib")


def code_moves() -> dict[str, str]:
    """Host dir -> where a sandbox sees it, for host_code_path() and every code mount."""
    return {host_code_path()[0]: CODE_DIR, **dict(_mounted_code())}


def python_executable() -> str:
    """The real interpreter (not the venv's symlink), so it resolves inside the sandbox."""
    return os.path.realpath(sys.executable)


def _mounted_code() -> list[tuple[str, str]]:
    """Read-only (host, inner) mounts of our code and the third-party packages it imports."""
    return [*_code_dirs(), (sysconfig.get_path("purelib"), SITE_PACKAGES_DIR)]


def environment(v: View) -> dict[str, str]:
    """The command's whole environment: nothing of the fleet's. (The guest runs Python isolated,
    so no PYTHON* variable could steer it anyway; it gives its commands a minimal env of its own.)"""
    return {"PATH": SANDBOX_PATH, "HOME": v.workspace, "TMPDIR": v.tmp, "LANG": "C.UTF-8"}


def write_etc(etc: Path, uids: list[int]) -> None:
    """Build the sandboxes' /etc once per server start: a copy of ETC_ENTRIES (symlinks into the
    system dirs kept as links) and a generated passwd and group (root, nobody and one `sandbox`
    entry per uid: the slot uids, or the fleet's own uid when not root; none of the host's users).
    One read-only bind of this dir costs a sandbox start one mount instead of one per entry."""
    shutil.rmtree(etc, ignore_errors=True)
    etc.mkdir(parents=True)
    etc.chmod(0o755)
    for name in ETC_ENTRIES:
        host, copy = Path("/etc", name), etc / name
        if host.is_symlink() and os.path.realpath(host).startswith("/usr/"):
            copy.symlink_to(os.readlink(host))
        elif host.is_dir():
            shutil.copytree(host, copy, symlinks=True, ignore=_secret_or_unreadable)
        elif host.is_file() and os.access(host, os.R_OK):
            shutil.copy2(host, copy)
    users = [(0, "root", "/root"), *((u, "sandbox", WORKSPACE) for u in uids if u), (65534, "nobody", "/")]
    passwd = "".join(f"{name}:x:{u}:{u}::{home}:/bin/sh\n" for u, name, home in users)
    group = "".join(f"{name}:x:{u}:\n" for u, name, _ in users)
    for name, text in zip(ETC_GENERATED, (passwd, group), strict=True):
        path = etc / name
        path.write_text(text)
        path.chmod(0o644)


def _secret_or_unreadable(directory: str, names: list[str]) -> set[str]:
    """What a copy of an /etc dir leaves out: private keys (/etc/ssl/private) and whatever the
    fleet's user cannot read anyway."""
    return {n for n in names if n == "private" or not os.access(os.path.join(directory, n), os.R_OK)}


def _shm_bytes(lim: TemplateLimits) -> int:
    return max(1, lim.memory_mb // SHM_SHARE) << 20


def rlimits(lim: TemplateLimits) -> dict[str, list[int]]:
    """Every sandbox process's rlimits: resource name -> [soft, hard]."""
    values = {
        "RLIMIT_AS": lim.memory_mb << 20, "RLIMIT_NPROC": lim.max_pids,
        "RLIMIT_FSIZE": lim.file_size_mb << 20, "RLIMIT_NOFILE": lim.open_files,
        "RLIMIT_CPU": lim.cpu_s, "RLIMIT_CORE": 0,
    }  # fmt: skip
    return {name: [value, value] for name, value in values.items()}


def _rlimits(lim: TemplateLimits) -> list[str]:
    """rlimits() as prlimit's options (--as=N sets soft and hard)."""
    return [f"--{name[7:].lower()}={soft}" for name, (soft, _) in rlimits(lim).items()]


def _drop_privileges(spec: SandboxSpec, command: list[str]) -> list[str]:
    """setpriv to the slot's uid with no capabilities, then prlimit, then the command."""
    limited = ["prlimit", *_rlimits(spec.limits), "--", *command]
    if os.geteuid() != 0:
        return limited
    return [
        "setpriv", f"--reuid={spec.uid}", f"--regid={spec.uid}", "--clear-groups",
        "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--", *limited,
    ]  # fmt: skip


def _system_mounts() -> list[tuple[str, str]]:
    """("link", target) for symlinked system dirs (/bin -> usr/bin), ("dir", "") for real ones."""
    out = []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            out.append((d, "link:" + os.readlink(d)))
        elif os.path.isdir(d):
            out.append((d, "dir"))
    return out


def bwrap_argv(spec: SandboxSpec, command: list[str]) -> list[str]:
    v = view("bwrap", spec)
    a = ["bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
    a += [] if spec.network == "host" else ["--unshare-net"]
    a += ["--die-with-parent", "--hostname", spec.hostname, "--clearenv"]
    a += _bwrap_parents([*_python_dirs(), *(i for _, i in _mounted_code()), *(i for _, i in _writable(spec))])
    for d, kind in _system_mounts():
        a += ["--symlink", kind[5:], d] if kind.startswith("link:") else ["--ro-bind", d, d]
    a += ["--ro-bind", str(spec.etc), "/etc"]
    for d in _python_dirs():
        a += ["--ro-bind", d, d]
    for host, inner in _mounted_code():
        a += ["--ro-bind", host, inner]
    a += ["--proc", "/proc", "--dev", "/dev"]
    a += ["--perms", "01777", "--size", str(_shm_bytes(spec.limits)), "--tmpfs", "/dev/shm"]
    a += ["--perms", "01777", "--size", str(spec.limits.tmp_mb << 20), "--tmpfs", "/tmp"]
    for host, inner in _writable(spec):
        a += ["--bind", host, inner]
    for h, inner in spec.skills:
        a += ["--ro-bind", str(h), inner]
    # Read-only root: as a normal user bwrap's root tmpfs would belong to the tenant's uid.
    a += ["--remount-ro", "/", "--chdir", WORKSPACE]
    for k, val in environment(v).items():
        a += ["--setenv", k, val]
    return [*a, "--", *_drop_privileges(spec, command)]


def _bwrap_parents(targets: list[str]) -> list[str]:
    """`--dir` with mode 0755 for each missing parent (bwrap makes them 0700, unreadable to the uid)."""
    parents: list[str] = []
    for t in targets:
        for p in reversed(Path(t).parents):
            if str(p) != "/" and str(p) not in parents and str(p) not in SYSTEM_DIRS:
                parents.append(str(p))
    out: list[str] = []
    for parent in parents:
        out += ["--perms", "0755", "--dir", parent]
    return out


def _writable(spec: SandboxSpec) -> list[tuple[str, str]]:
    """Host dirs bound writable. /tmp is not one: it is a tmpfs of the template's `tmp_mb`, so
    filling it fails with ENOSPC inside the sandbox instead of filling the host's disk."""
    return [(str(spec.workspace), WORKSPACE), (str(spec.state), STATE_DIR)]


_UNSHARE_PROLOGUE = """set -eu
R={root}
mount -t tmpfs -o mode=0755,size=16m atefleet-root "$R"
ro() {{ mount -o bind,ro "$1" "$R$2"; }}
rw() {{ mount --bind "$1" "$R$2"; }}
"""
_UNSHARE_EPILOGUE = """mount -t proc proc "$R/proc"
mount -t tmpfs -o mode=0755,size=64k atefleet-dev "$R/dev"
for n in null zero full random urandom tty; do touch "$R/dev/$n"; mount --bind "/dev/$n" "$R/dev/$n"; done
ln -s /proc/self/fd "$R/dev/fd"
for i in 0:stdin 1:stdout 2:stderr; do ln -s "/proc/self/fd/${{i%%:*}}" "$R/dev/${{i#*:}}"; done
mkdir "$R/dev/shm" && mount -t tmpfs -o mode=1777,size={shm_bytes} atefleet-shm "$R/dev/shm"
mkdir -p "$R/tmp" && mount -t tmpfs -o mode=1777,size={tmp_bytes} atefleet-tmp "$R/tmp"
hostname {hostname}
{lo}
mount -o remount,ro "$R"
set +e
chroot "$R" {command} &
child=$!
# pid 1 of the namespace: forward SIGTERM to the command; `wait` also reaps orphans.
trap 'kill -TERM "$child" 2>/dev/null' TERM INT
while :; do wait "$child"; rc=$?; kill -0 "$child" 2>/dev/null || break; done
exit "$rc"
"""


def unshare_script(spec: SandboxSpec, command: list[str]) -> str:
    q = shlex.quote
    lines = [_UNSHARE_PROLOGUE.format(root=q(str(spec.root)))]
    # One mkdir for every mount point: each command here is a process spawn on the resume path.
    targets = [d for d, kind in _system_mounts() if kind == "dir"] + _python_dirs()
    targets += [i for _, i in (*_mounted_code(), *_writable(spec))] + [i for _, i in spec.skills]
    lines.append('cd "$R" && mkdir -p ' + " ".join(q(t.lstrip("/")) for t in targets) + " etc proc dev")
    for d, kind in _system_mounts():
        if kind.startswith("link:"):
            lines.append(f'ln -s {q(kind[5:])} "$R"{q(d)}')
        else:
            lines.append(f"ro {q(d)} {q(d)}")
    lines.append(f"ro {q(str(spec.etc))} /etc")
    for d in _python_dirs():
        lines.append(f"ro {q(d)} {q(d)}")
    lines += [f"ro {q(h)} {q(i)}" for h, i in _mounted_code()]
    lines += [f"rw {q(h)} {q(i)}" for h, i in _writable(spec)]
    lines += [f"ro {q(str(h))} {q(i)}" for h, i in spec.skills]
    inner = _drop_privileges(spec, [*_env_argv("unshare", spec), *command])
    lo = "ip link set lo up 2>/dev/null || true" if spec.network != "host" else ""
    lines.append(_UNSHARE_EPILOGUE.format(hostname=q(spec.hostname), lo=lo, command=shlex.join(inner),
                                          shm_bytes=_shm_bytes(spec.limits),
                                          tmp_bytes=spec.limits.tmp_mb << 20))
    return "\n".join(lines)


def unshare_argv(spec: SandboxSpec, command: list[str]) -> list[str]:
    ns = ["--mount", "--pid", "--fork", "--ipc", "--uts"] + ([] if spec.network == "host" else ["--net"])
    # pdeathsig + --kill-child: if the server dies, unshare dies and takes the namespace with it.
    return [
        "setpriv", "--pdeathsig=KILL", "--", "unshare", *ns, "--kill-child", "--propagation=private",
        "--", "sh", "-c", unshare_script(spec, command),
    ]  # fmt: skip


def _env_argv(level: str, spec: SandboxSpec) -> list[str]:
    v = view(level, spec)
    return ["env", "-i", f"--chdir={v.workspace}", *(f"{k}={val}" for k, val in environment(v).items())]


def none_argv(spec: SandboxSpec, command: list[str]) -> list[str]:
    # No uid change: the slot dirs live under the 0700 state dir, which only a sandbox hides.
    return ["prlimit", *_rlimits(spec.limits), "--", *_env_argv("none", spec), *command]


def argv_for(level: str, spec: SandboxSpec, command: list[str]) -> list[str]:
    if level == "bwrap":
        return bwrap_argv(spec, command)
    if level == "unshare":
        return unshare_argv(spec, command)
    return none_argv(spec, command)


def _launcher(spec: SandboxSpec, argv: list[str]) -> list[str]:
    """Join the slot cgroup before exec, so no process of the sandbox ever runs outside it; and
    make the sandbox the OOM killer's first choice (inherited; lowering it needs a privilege the
    tenant lacks), before any fleet process: a host short of memory loses a sandbox (its actor
    falls back to its last snapshot), not Redis or a worker. Frozen sandboxes hold memory too."""
    joins = "".join(f"echo $$ > {shlex.quote(p)} && " for p in spec.cgroup.procs_files) if spec.cgroup else ""
    oom = f"{{ echo {OOM_SCORE_ADJ} > /proc/self/oom_score_adj; }} 2>/dev/null; "
    return ["sh", "-c", f'{oom}{joins}exec "$@"', "sh", *argv]


def _probe(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


#: What to run when no sandbox level works here.
INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: `sudo apt-get install bubblewrap`; Fedora/RHEL: "
    "`sudo dnf install bubblewrap`), or run as root (the `unshare` level); "
    "`local_substrate.sandbox: none` runs actors unsandboxed, for trusted code only"
)


class SandboxUnavailable(RuntimeError):
    """The requested sandbox level (or, for "auto", every level but "none") does not work here."""


def level_works(level: str) -> bool:
    """Whether sandbox level "bwrap" or "unshare" can create its namespaces on this machine."""
    probes = {
        "bwrap": ["bwrap", "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/", "true"],
        "unshare": ["unshare", "--mount", "--pid", "--fork", "--net", "--ipc", "--uts", "true"],
    }
    return bool(shutil.which(level)) and _probe(probes[level])


#: Threads the probe below holds while it runs, so that this uid runs enough tasks to tell the
#: two ways of counting RLIMIT_NPROC apart whatever else runs.
NPROC_PROBE_THREADS = 8
#: Forks once: exit 0 when the fork succeeds, 1 when the process limit refuses it.
_FORK_ONCE = (
    "import os, sys\ntry:\n    pid = os.fork()\nexcept OSError:\n    sys.exit(1)\n"
    "if pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)"
)


def nproc_counted_per_sandbox(level: str) -> bool:
    """Whether a sandbox's RLIMIT_NPROC (`max_pids`) counts only its own processes. As root each
    slot has a uid of its own. As a normal user every bwrap sandbox runs as the fleet's uid, and
    the limit counts all of that uid's processes together, unless the kernel counts it per user
    namespace (Linux 5.14 on), each sandbox being one. Probed: a fork in a sandbox whose limit is
    half of what this uid runs already succeeds only where the sandbox's own processes count."""
    if level == "none":
        return False
    if os.geteuid() == 0:
        return True
    if level != "bwrap":
        return False
    done = threading.Event()
    held = [threading.Thread(target=done.wait, daemon=True) for _ in range(NPROC_PROBE_THREADS)]
    for t in held:
        t.start()
    try:
        limit = _tasks_of(os.getuid()) // 2
        return _probe(["bwrap", "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/", "prlimit",
                       f"--nproc={limit}", "--", sys.executable, "-I", "-S", "-c", _FORK_ONCE])
    finally:
        done.set()
        for t in held:
            t.join()


def _tasks_of(uid: int) -> int:
    """Threads of every process `uid` runs (what RLIMIT_NPROC counts)."""
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{name}/task"))
            except OSError:
                continue
    return count


def detect_level(requested: str) -> str:
    """The sandbox level to use: `requested`, or for "auto" the best that works here. "none" only
    when asked for by name: "auto" never silently runs tenant code unsandboxed."""
    if requested == "none":
        log.warning(
            "SANDBOX DISABLED (local_substrate.sandbox: none): actors run as plain processes on this "
            "host. Commands can read the fleet's files and reach its ports. Trusted code only."
        )
        return "none"
    candidates = ("bwrap", "unshare") if requested == "auto" else (requested,)
    for level in candidates:
        if level_works(level):
            return level
    tried = " or ".join(candidates)
    raise SandboxUnavailable(f"sandbox level {requested!r}: {tried} does not work here; {INSTALL_HINT}")


def children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


async def readable(fd: int | socket.socket) -> None:
    """Until `fd` is readable: data, its end, a peer gone, or (a pidfd) its process exited."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


class SandboxProcess:
    """A started sandbox; `stop` ends it gracefully, `kill` at once."""

    def __init__(self, level: str, spec: SandboxSpec, proc: asyncio.subprocess.Process) -> None:
        self.level = level
        self.spec = spec
        self.proc = proc
        #: (host pid, pidfd) of a guest the zygote started (local_substrate/zygote.py): its
        #: process tree is not the launcher's.
        self.guest: tuple[int, int] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _guest_pid(self) -> int | None:
        """The zygote guest's pid while it lives (its pidfd turns readable once it exited)."""
        if self.guest is None or select.select([self.guest[1]], [], [], 0)[0]:
            return None
        return self.guest[0]

    def roots(self) -> list[int]:
        """The roots of the sandbox's process trees: the launcher, and a zygote guest."""
        guest_pid = self._guest_pid()
        return [self.pid] if guest_pid is None else [self.pid, guest_pid]

    def _init_pid(self) -> int | None:
        kids = children(self.pid)
        return kids[0] if kids else None

    async def ended(self) -> int | None:
        """Until the sandbox ends: its launcher exits (its status), or a zygote's guest does
        (None), whatever the sandbox's waiter does then: its tenant may have stopped it."""
        if self.guest is None:
            return await self.proc.wait()
        waits = {asyncio.ensure_future(self.proc.wait()), asyncio.ensure_future(readable(self.guest[1]))}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        return self.proc.returncode

    def _command_pid(self) -> int | None:
        if self.level == "none":
            return self.pid
        init = self._init_pid()
        kids = children(init) if init else []
        return kids[0] if kids else None

    def _terminate(self) -> bool:
        """SIGTERM the command (a zygote's guest through its pidfd); False when there is none."""
        if self.guest is not None:
            try:
                signal.pidfd_send_signal(self.guest[1], signal.SIGTERM)
            except ProcessLookupError:
                return False
            return True
        target = self._command_pid()
        if target:
            _signal(target, signal.SIGTERM)
        return target is not None

    def kill(self) -> None:
        """SIGKILL everything: the namespace init, which takes its namespace with it, then the
        cgroup. The launcher that started the init then exits by itself (`reap` waits for it).
        Killing it as well would orphan the init, and an init system that does not reap orphans
        (as in many containers and VMs) would keep it a zombie for good, counted against the
        user's process limit. The launcher is killed only when it has no init (yet)."""
        if self.level == "none":
            _signal(-self.pid, signal.SIGKILL)
        else:
            init = self._init_pid()
            if init:
                _signal(init, signal.SIGKILL)
                _signal(self.pid, signal.SIGCONT)  # a frozen launcher must run to reap it and exit
            else:
                _signal(self.pid, signal.SIGKILL)
        if self.spec.cgroup:
            self.spec.cgroup.kill_all()

    async def stop(self, grace_s: float) -> None:
        """SIGTERM the command, wait up to `grace_s`, then SIGKILL whatever is left."""
        if self.proc.returncode is None:
            if self._terminate():
                # A frozen sandbox (local_substrate/frozen.py) gets it only once continued.
                frozen.thaw(*self.roots())
            try:
                await asyncio.wait_for(self.proc.wait(), timeout=grace_s)
            except TimeoutError:
                log.warning("sandbox %s ignored SIGTERM for %.1f s: killing it", self.spec.hostname, grace_s)
        await self.reap()

    async def reap(self) -> None:
        """Kill whatever is left and wait until it is gone, so the slot's next actor starts clean."""
        self.kill()
        try:
            await asyncio.wait_for(self.proc.wait(), LAUNCHER_EXIT_S)
        except TimeoutError:
            _signal(self.pid, signal.SIGKILL)
            await self.proc.wait()
        if self.spec.cgroup is not None:
            await self.spec.cgroup.wait_empty()
        if self.guest is not None:
            os.close(self.guest[1])
            self.guest = None


async def start_sandbox(
    level: str, spec: SandboxSpec, command: list[str], pass_fds: tuple[int, ...] = ()
) -> SandboxProcess:
    """Start `command` (built with `view(level, spec)` paths) in a new sandbox; `pass_fds` stay
    open in it at the same numbers (the guest's listening socket)."""
    argv = _launcher(spec, argv_for(level, spec, command))
    # Only the latest run's output is kept per slot: enough to see why a guest did not start.
    with open(spec.log_path, "wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
            env=LAUNCH_ENV, pass_fds=pass_fds,
        )
    return SandboxProcess(level, spec, proc)
