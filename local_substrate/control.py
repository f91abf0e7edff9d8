"""The local Substrate's actor lifecycle: the behaviour table of SUBSTRATE_CONTROL.md.

Statuses: create → SUSPENDED (no snapshot); resume: SUSPENDED/PAUSED → RESUMING → RUNNING
(restore the latest snapshot, else the template's golden one, else — with `boot` — an empty
workspace); suspend: RUNNING → SUSPENDING → SUSPENDED (stop the guest, snapshot, free the slot);
pause: the same ending PAUSED; delete only from SUSPENDED. The way out of a failed operation is
to repeat it: a resume of a RESUMING actor restarts the resume, a suspend of a SUSPENDING one
retries the checkpoint (so does a resume, before resuming).

One operation per actor at a time: a second resume/suspend/pause while one runs gets ABORTED
"another operation is in progress" (nothing queues). The lock is keyed by actor name only, like
upstream's, so names are unique across atespaces here. Operations run as tasks shielded from the
RPC's cancellation: a client that gives up does not leave a half-started sandbox behind.

Files (workspace + guest state dir) survive a suspend; processes survive only while the
actor's sandbox stays frozen (`frozen_max`, local_substrate/frozen.py: the next resume continues
it), never a restart of this server or a resume after the frozen sandbox was evicted. If a
guest dies on its own (or with a killed slot, or with the server), its actor falls back to
SUSPENDED at its last snapshot — work since then is lost — as upstream does when a worker pod dies.
So does an actor the disk guard stops (over its template's limits while the disk is low,
`disk_guard`); its next resume is refused once, saying so.

Held files: the fleet's own park (a SuspendActor with PARK_KEY) of a sandbox that is kept frozen
writes no snapshot when one would keep the tree exactly; the slot's dirs hold the actor's latest
files (`ActorRecord.held`, persisted) for as long as the actor stays there, frozen or running on
after a resume. They are written as its snapshot (`_keep_held`) before anything else can end that
sandbox or hand its slot out: an eviction, a client's suspend (also of an actor already
suspended), a guest that dies, a restart of this server. So the fallback above is to those
files, never to a snapshot older than the actor's last suspend. Only a delete and the disk guard
(which stops an actor over its limits, at its last snapshot) drop them.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import sqlite3
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from common.config import DNS1123_LABEL, Config, TemplateConfig
from local_substrate import frozen
from local_substrate.cgroups import Cgroups
from local_substrate.errors import (
    IN_PROGRESS,
    NO_FREE_WORKERS,
    ControlError,
    invalid,
    not_found,
    precondition,
    snapshot_failed,
    workspace_over_quota,
)
from local_substrate.faults import Faults
from local_substrate.golden import GoldenSnapshots
from local_substrate.guests import sandbox_spec, start_guest
from local_substrate.layout import Layout
from local_substrate.slots import Slot, SlotPool, UidBlock
from local_substrate.snapshots import HOST_ERRNOS, SnapshotLimits, SnapshotStore, measure, restore_snapshot
from local_substrate.store import ActorRecord, Status, Store
from local_substrate.trees import MODES_CHANGED
from local_substrate.zygote import Zygote

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Sandbox levels whose sandboxes can be kept frozen: those with a pid namespace, where every
#: process of the tenant's stays in the tree that is stopped (and dies with the server). Without
#: one (`none`), a process can leave the tree, and a stopped guest would outlive the server.
FREEZABLE_LEVELS = frozenset({"bwrap", "unshare"})


def can_keep_frozen(level: str, nproc_per_sandbox: bool) -> bool:
    """Whether this server keeps suspended sandboxes frozen: at a level with a pid namespace, and
    where a sandbox's RLIMIT_NPROC counts only its own processes (`sandbox.nproc_counted_per_sandbox`:
    as root, or bwrap on a kernel that counts per user namespace). Elsewhere every sandbox shares
    the fleet's uid's budget (`max_pids`), which stopped sandboxes would use up for running ones."""
    return level in FREEZABLE_LEVELS and nproc_per_sandbox

#: ListActors page size bounds (SUBSTRATE_CONTROL.md).
DEFAULT_PAGE_SIZE = 1000
MAX_PAGE_SIZE = 1000


def check_label(kind: str, value: str) -> None:
    if not DNS1123_LABEL.match(value):
        raise invalid(f"{kind} {value!r} is not a DNS-1123 label")


def encode_token(rec: ActorRecord) -> str:
    return base64.urlsafe_b64encode(json.dumps([rec.atespace, rec.name]).encode()).decode()


def decode_token(token: str) -> tuple[str, str]:
    try:
        atespace, name = json.loads(base64.urlsafe_b64decode(token.encode()))
        return str(atespace), str(name)
    except (ValueError, TypeError) as err:
        raise invalid("page_token is not valid") from err


class Control:
    """Actors, atespaces and slots of one local Substrate (all calls on one event loop)."""

    def __init__(self, config: Config, layout: Layout, level: str, uids: UidBlock,
                 nproc_per_sandbox: bool) -> None:
        self._config = config
        self._layout = layout
        self.level = level
        self.keeps_frozen = can_keep_frozen(level, nproc_per_sandbox)
        self.stop_grace_s = config.local_substrate.stop_grace_s
        self.store = Store(layout.db)
        self.cgroups = Cgroups(
            layout.root.name + "-" + uuid.uuid5(uuid.NAMESPACE_URL, str(layout.root)).hex[:8],
            cpu_weight=config.local_substrate.sandbox_cpu_weight,
        )
        self.slots = SlotPool(layout, uids, config.local_substrate.slots, config.local_substrate.frozen_max)
        self._frozen_min_available = config.local_substrate.frozen_min_available_mb << 20
        self.snapshots = SnapshotStore(layout.snapshots)
        self.golden = GoldenSnapshots(layout, level, self.cgroups, uids)
        #: Guests are forked from it where bwrap makes the sandboxes (local_substrate/zygote.py).
        self.zygote = Zygote(layout.logs / "zygote.log") if level == "bwrap" else None
        self._templates = {t.name for t in config.local_substrate.templates} | {
            e.template for e in config.environments
        }
        self._busy: set[str] = set()
        #: Slots whose suspend is stopping their sandbox; notified as each is done (_running_place).
        self._stilling: set[str] = set()
        self._places = asyncio.Condition()
        #: Actors whose held files are being written (_keep_held); notified as each is done.
        self._keeping: set[str] = set()
        self._kept = asyncio.Condition()
        self.faults = Faults(config.local_substrate.faults)
        self._ops: set[asyncio.Task[Any]] = set()

    # -- startup / shutdown -----------------------------------------------------------------------

    def recover(self) -> None:
        """After a restart: guests died with the old server, so RUNNING actors fall back to their
        last snapshot (SUSPENDED); RESUMING ones stay RESUMING (a resume retries); SUSPENDING and
        PAUSING ones keep their slot, whose dirs still hold the workspace (a suspend retries)."""
        for rec in self.store.all():
            slot = self.slots.get(rec.slot) if rec.slot else None
            home = self.slots.get(rec.held) if rec.held else None
            if home is not None and rec.status is not Status.SUSPENDING and rec.status is not Status.PAUSING:
                # Its sandbox died with the old server, not its files: they are written at once.
                home.actor, home.holding = rec.name, True
                self._spawn(self._keep_or_hold(rec, home))
            if rec.status is Status.RUNNING:
                log.warning("actor %s/%s was running when the server stopped: back to its %s", rec.atespace,
                            rec.name, "files held in its slot" if home else "last snapshot")  # fmt: skip
                self.store.update(rec.evolve(status=Status.SUSPENDED, slot="", run_id=""))
            elif rec.status in (Status.SUSPENDING, Status.PAUSING) and slot is not None:
                slot.actor = rec.name
            elif rec.slot:
                self.store.update(rec.evolve(slot="", run_id=""))
        for slot in self.slots.slots:
            if slot.dirs.base.exists():  # slots never used have nothing to clean (reset creates)
                slot.dirs.prepare()
        self.snapshots.collect({rec.uid: rec.snapshot for rec in self.store.all()})
        self.golden.collect([self._config.template(t) for t in sorted(self._templates)])

    async def close(self, suspend_running: bool = True) -> None:
        """Finish running operations, snapshot running actors (or not), stop every sandbox."""
        # From now on a suspend stops its sandbox: one kept frozen would outlive this server, its
        # processes running as uids the next server on this host may take.
        self.keeps_frozen = False
        if self._ops:
            await asyncio.wait(set(self._ops), timeout=60)
        busy = [s for s in self.slots.slots if s.process is not None]
        # Concurrently: a guest that ignores SIGTERM must not delay the others by its grace period.
        outcomes = await asyncio.gather(
            *(self._close_slot(s, suspend_running) for s in busy), return_exceptions=True
        )
        for slot, outcome in zip(busy, outcomes, strict=True):
            if isinstance(outcome, Exception):
                log.error("stopping %s failed: %s", slot.name, outcome)
        if self.zygote is not None:
            await self.zygote.close()
        self.store.close()
        self.cgroups.remove_all()

    async def _close_slot(self, slot: Slot, suspend_running: bool) -> None:
        rec = self.store.find_name(slot.actor)
        if suspend_running and rec is not None and rec.status is Status.RUNNING:
            await self.suspend(rec.atespace, rec.name)
        else:
            await self._stop_process(slot)
            if suspend_running and rec is not None and rec.held == slot.name:
                await self._keep_or_hold(rec, slot)

    # -- atespaces --------------------------------------------------------------------------------

    def create_atespace(self, name: str) -> str:
        check_label("atespace", name)
        if not self.store.add_atespace(name):
            raise ControlError("ALREADY_EXISTS", f"atespace {name} already exists")
        return name

    def get_atespace(self, name: str) -> str:
        if not self.store.atespace_exists(name):
            raise not_found(f"atespace {name}")
        return name

    def list_atespaces(self) -> list[str]:
        return self.store.atespaces()

    def delete_atespace(self, name: str) -> None:
        self.get_atespace(name)
        if self.store.count_actors(name):
            raise precondition(f"atespace {name} still has actors")
        self.store.remove_atespace(name)

    # -- actors: quick calls ----------------------------------------------------------------------

    def get_actor(self, atespace: str, name: str) -> ActorRecord:
        check_label("atespace", atespace)
        check_label("actor name", name)
        rec = self.store.get(atespace, name)
        if rec is None:
            raise not_found(f"actor {atespace}/{name}")
        return rec

    def create_actor(
        self, atespace: str, name: str, template_namespace: str, template: str, selector: dict[str, str]
    ) -> ActorRecord:
        check_label("atespace", atespace)
        check_label("actor name", name)
        if self.store.find_name(name) is not None:
            raise ControlError("ALREADY_EXISTS", f"actor {name} already exists")
        if not self.store.atespace_exists(atespace):
            raise precondition(f"atespace {atespace} not found")
        if template not in self._templates:
            raise precondition(f"actor template {template_namespace}/{template} not found")
        rec = ActorRecord(atespace, name, template_namespace, template, selector=selector)
        try:
            self.store.insert(rec)
        except sqlite3.IntegrityError as err:
            raise ControlError("ALREADY_EXISTS", f"actor {name} already exists") from err
        return rec

    def update_actor(self, atespace: str, name: str, selector: dict[str, str]) -> ActorRecord:
        return self.store.update(self.get_actor(atespace, name).evolve(selector=selector))

    def delete_actor(self, atespace: str, name: str) -> None:
        rec = self.get_actor(atespace, name)
        if rec.status is not Status.SUSPENDED:
            raise precondition(f"actor {atespace}/{name} is not suspended (status: STATUS_{rec.status.name})")
        if not self.store.delete(rec):
            raise ControlError("ABORTED", "concurrent update conflict")
        home = self.slots.frozen_of(name) or self._holding(rec)
        if home is not None:
            self._spawn(self._evict(home))
        self.snapshots.delete_actor(rec.uid)

    def list_actors(self, page_size: int, token: str, atespace: str) -> tuple[list[ActorRecord], str]:
        if page_size < 0 or page_size > MAX_PAGE_SIZE:
            raise invalid(f"page_size must be between 0 and {MAX_PAGE_SIZE}")
        if atespace:
            check_label("atespace", atespace)
        size = page_size or DEFAULT_PAGE_SIZE
        rows = self.store.page(atespace, decode_token(token) if token else ("", ""), size + 1)
        return rows[:size], (encode_token(rows[size - 1]) if len(rows) > size else "")

    def workers(self) -> list[tuple[Slot, ActorRecord | None]]:
        """The `slots` workers: the slots running an actor, then as many others as are free."""
        running = [s for s in self.slots.slots if s.running]
        idle = [s for s in self.slots.slots if not s.running][: max(0, self.slots.count - len(running))]
        return [(s, self.store.find_name(s.actor)) for s in running] + [(s, None) for s in idle]

    def running(self) -> list[tuple[Slot, ActorRecord]]:
        """Slots whose actor is RUNNING and in no operation (what the disk guard measures)."""
        out: list[tuple[Slot, ActorRecord]] = []
        for slot in self.slots.slots:
            if not slot.actor or slot.process is None or slot.stopping or slot.actor in self._busy:
                continue
            rec = self.store.find_name(slot.actor)
            if rec is not None and rec.status is Status.RUNNING and rec.slot == slot.name:
                out.append((slot, rec))
        return out

    def debug_clear(self) -> None:
        if self.slots.busy or self._busy:
            raise precondition("actors are running; suspend them first")
        for slot in self.slots.slots:
            if slot.frozen or slot.holding:  # (their actors go: nothing held is written)
                self._spawn(self._evict(slot))
        for rec in self.store.all():
            self.snapshots.delete_actor(rec.uid)
        self.store.clear()

    # -- actors: lifecycle ------------------------------------------------------------------------

    async def resume(self, atespace: str, name: str, boot: bool) -> ActorRecord:
        rec = self.get_actor(atespace, name)
        if rec.status is Status.RUNNING:
            return rec
        return await self._exclusive(name, lambda: self._resume(atespace, name, boot))

    async def suspend(self, atespace: str, name: str, park: bool = False) -> ActorRecord:
        """Suspend; `park` (the fleet's own park, PARK_KEY) lets a sandbox kept frozen hold its files
        without a snapshot. Any other suspend writes one, also of files a park left held."""
        rec = self.get_actor(atespace, name)
        if rec.status is Status.SUSPENDED and (park or not rec.held):
            return rec
        return await self._exclusive(name, lambda: self._suspend(atespace, name, Status.SUSPENDED, park))

    async def pause(self, atespace: str, name: str) -> ActorRecord:
        rec = self.get_actor(atespace, name)
        if rec.status is Status.PAUSED:
            return rec
        return await self._exclusive(name, lambda: self._suspend(atespace, name, Status.PAUSED))

    async def stop_over_quota(self, slot: Slot, seen: ActorRecord, breach: str) -> bool:
        """The disk guard's stop of an actor over its template's limits: back at its last snapshot
        (SUSPENDED, `breach` kept for its next resume), killed at once, then its slot's dirs deleted
        (the disk is low now, not at the slot's next resume) and the slot freed. False when the
        actor moved on since it was measured (a suspend got there first, or a new run)."""
        if seen.name in self._busy:
            return False
        if not await self._exclusive(seen.name, lambda: self._stop_over_quota(slot, seen, breach)):
            return False
        # Outside the actor's lock: it may resume (in another slot) while this one is emptied.
        try:
            await asyncio.to_thread(slot.dirs.reset)
        except OSError as err:
            log.error("slot %s: deleting the files of %s failed (%s); its next resume resets it", slot.name,
                      seen.name, err)  # fmt: skip
        self.slots.release(slot)
        return True

    async def _stop_over_quota(self, slot: Slot, seen: ActorRecord, breach: str) -> bool:
        rec = self.store.get(seen.atespace, seen.name)
        if rec is None or rec.status is not Status.RUNNING or rec.run_id != seen.run_id:
            return False
        # Recorded before the kill: a worker that sees its guest go asks at once, and must find
        # the actor suspended (its resume waits for this lock, then is refused with `breach`).
        self.store.update(rec.evolve(status=Status.SUSPENDED, slot="", run_id="", breach=breach, held=""))
        await self._stop_process(slot, kill=True)
        log.warning("disk guard: stopped %s/%s in %s, back at its last snapshot: %s", rec.atespace, rec.name,
                    slot.name, breach)  # fmt: skip
        return True

    async def kill_slot(self, name: str) -> None:
        """Fault injection: SIGKILL the slot's sandbox, as if its worker pod died."""
        slot = self.slots.get(name)
        if slot is None or slot.process is None:
            raise not_found(f"running slot {name}")
        watcher = slot.watcher
        slot.process.kill()
        if watcher is not None:
            await watcher

    async def _exclusive(self, name: str, op: Callable[[], Awaitable[T]]) -> T:
        if name in self._busy:
            raise ControlError("ABORTED", IN_PROGRESS)
        self._busy.add(name)
        task: asyncio.Task[T] = asyncio.create_task(self._run_op(name, op))
        self._ops.add(task)
        task.add_done_callback(self._ops.discard)
        return await asyncio.shield(task)

    def _spawn(self, op: Awaitable[None]) -> None:
        """Run `op` in the background; `close` waits for it."""
        task = asyncio.ensure_future(op)
        self._ops.add(task)
        task.add_done_callback(self._ops.discard)

    async def _run_op(self, name: str, op: Callable[[], Awaitable[T]]) -> T:
        try:
            return await op()
        finally:
            self._busy.discard(name)

    async def _running_place(self) -> None:
        """Wait while every running place is taken but a suspend is stopping a sandbox: it frees
        that place once the sandbox is stopped, before its snapshot is written (Slot.stilled), so
        a resume then runs alongside that write instead of being refused for it."""
        async with self._places:
            while self._stilling and self.slots.busy >= self.slots.count:
                await self._places.wait()

    def template(self, rec: ActorRecord) -> TemplateConfig:
        return self._config.template(rec.template_name)

    def _skills(self, template: TemplateConfig) -> tuple[tuple[Path, str], ...]:
        """Where the template's skills appear: at each environment's skills_dir that uses it."""
        inner = sorted({e.skills_dir for e in self._config.environments if e.template == template.name})
        return tuple((self._skills_host(template, path), path) for path in inner or ["/skills"])

    def _skills_host(self, template: TemplateConfig, inner: str) -> Path:
        """The template's skills_dir; else the environment's path if it exists on the host; else empty."""
        host = Path(template.skills_dir or inner)
        if host.is_dir():
            return host
        if template.skills_dir:
            log.warning("template %s: skills_dir %s is not a directory", template.name, host)
        return self._layout.empty

    async def _resume(self, atespace: str, name: str, boot: bool) -> ActorRecord:
        rec = self.get_actor(atespace, name)
        if rec.status is Status.RUNNING:
            return rec
        if rec.breach:
            # Said once, so the tenant learns why its work since the last snapshot is gone (the
            # call in flight when the guard stopped it, or the next one); the next resume proceeds.
            self.store.update(rec.evolve(breach=""))
            raise workspace_over_quota(f"{atespace}/{name}", rec.breach)
        if rec.status in (Status.SUSPENDING, Status.PAUSING) and self.faults.upstream_transit:
            rec = await self._drop_checkpoint(rec)
        elif rec.status in (Status.SUSPENDING, Status.PAUSING):
            # An earlier suspend failed midway: finish its checkpoint first, then resume from it.
            rec = await self._suspend(atespace, name, Status.SUSPENDED)
        self._release_leftover(rec)
        await self._running_place()
        home = self.slots.frozen_of(name)
        if home is not None:
            thawed = await self._thaw(rec, home)
            if thawed is not None:
                return thawed
            rec = self.get_actor(atespace, name)  # its held files were written as it was killed
        if rec.held:  # its sandbox is gone, its files are not (another slot's resume restores them)
            rec = await self._keep_held(rec)
        slot = await self._claim(name)
        if slot is None:
            raise precondition(NO_FREE_WORKERS)
        rec = self.store.update(rec.evolve(status=Status.RESUMING, slot=slot.name, run_id=uuid.uuid4().hex))
        try:
            self.faults.midway("ResumeActor")
            await self._start(rec, slot, boot)
        except BaseException:
            self.slots.release(slot)
            # Stays RESUMING: the next resume retries (the way out upstream offers too).
            self.store.update(rec.evolve(slot=""))
            raise
        rec = self.store.update(rec.evolve(status=Status.RUNNING))
        slot.watcher = asyncio.create_task(self._watch(slot, rec))
        return rec

    async def _claim(self, name: str) -> Slot | None:
        """A slot for `name`'s sandbox; when a worker is free but every slot holds a frozen
        sandbox, the least recently frozen one is killed for it."""
        slot = self.slots.claim(name)
        if slot is None and self.slots.busy < self.slots.count:
            victim = self.slots.oldest_frozen()
            if victim is not None:
                await self._evict(victim)
                slot = self.slots.claim(name)
        return slot

    async def _thaw(self, rec: ActorRecord, slot: Slot) -> ActorRecord | None:
        """Resume the actor by continuing its frozen sandbox in `slot`; None when that sandbox is
        not its latest state (then it is killed, and the resume restores the snapshot)."""
        process = slot.process
        latest = rec.held == slot.name if rec.held else slot.snapshot == rec.snapshot
        if (
            rec.status is not Status.SUSPENDED
            or not latest
            or process is None
            or process.proc.returncode is not None
        ):
            await self._evict(slot)
            return None
        if self.slots.busy >= self.slots.count:
            raise precondition(NO_FREE_WORKERS)
        frozen_run = slot.run_id
        self.slots.thaw(slot)
        rec = self.store.update(
            rec.evolve(status=Status.RESUMING, slot=slot.name, run_id=uuid.uuid4().hex), durable=False
        )
        try:
            self.faults.midway("ResumeActor")
            # A new incarnation, as after any resume: an address cached before the suspend no
            # longer connects (the bound socket moves; the guest keeps serving it).
            self._layout.socket(slot.name, frozen_run).rename(self._layout.socket(slot.name, rec.run_id))
            frozen.thaw(*process.roots())
        except BaseException:
            await self._stop_process(slot, kill=True)
            rec = self.store.update(rec.evolve(slot=""))  # stays RESUMING, as a resume that failed midway
            if rec.held:
                await self._keep_or_hold(rec, slot)
            if not slot.holding:
                self.slots.release(slot)
            raise
        rec = self.store.update(rec.evolve(status=Status.RUNNING), durable=False)
        if slot.watcher is not None:
            slot.watcher.cancel()
        slot.watcher = asyncio.create_task(self._watch(slot, rec))
        return rec

    async def evict_frozen(self) -> None:
        """Kill every frozen sandbox and delete its slot's files (their actors resume from their
        snapshots): the disk guard's first step while the disk is low."""
        for slot in self.slots.slots:
            if slot.frozen and not slot.stopping:  # checked at each: a resume may have thawed it
                await self._evict(slot, delete_files=True)

    async def _evict(self, slot: Slot, delete_files: bool = False) -> None:
        """Kill a frozen sandbox and empty its slot, once its actor's files are in a snapshot
        (written at its suspend, or now if that left them held)."""
        slot.stopping = True  # from now on no resume continues it, nor picks it again
        await self._stop_process(slot, kill=True)
        rec = self._holder(slot)
        if rec is not None:
            await self._keep_or_hold(rec, slot)
            if slot.holding:
                return
        if delete_files:  # while the slot is still held: no resume restores into it meanwhile
            try:
                await asyncio.to_thread(slot.dirs.reset)
            except OSError as err:
                log.error("slot %s: deleting a frozen sandbox's files failed (%s)", slot.name, err)
        self.slots.release(slot)

    async def _freeze(self, slot: Slot) -> bool:
        """Stop every process of the slot's sandbox, to keep it for the actor's next resume; False
        when freezing is off, memory is short (the least recently frozen sandbox is killed then),
        or the sandbox would not stop."""
        process = slot.process
        if (
            not self.slots.can_freeze
            or not self.keeps_frozen
            or process is None
            or process.proc.returncode is not None
        ):
            return False
        if frozen.mem_available_bytes() < self._frozen_min_available:
            victim = self.slots.oldest_frozen()
            if victim is not None:
                await self._evict(victim)
            return False
        return await frozen.freeze(*process.roots())

    async def _drop_checkpoint(self, rec: ActorRecord) -> ActorRecord:
        """Upstream's resume of an actor a failed suspend left in transit: the slot's files are
        dropped, so the resume restores the snapshot from before that suspend."""
        slot = self.slots.get(rec.slot) if rec.slot else None
        if slot is not None and slot.actor == rec.name:
            await self._stop_process(slot)
            self.slots.release(slot)
        return self.store.update(rec.evolve(slot="", run_id="", held=""))

    def _release_leftover(self, rec: ActorRecord) -> None:
        slot = self.slots.get(rec.slot) if rec.slot else None
        if slot is not None and slot.actor == rec.name and slot.process is None:
            self.slots.release(slot)

    async def _start(self, rec: ActorRecord, slot: Slot, boot: bool) -> None:
        template = self.template(rec)
        skills = self._skills(template)
        source: Path | None = Path(rec.snapshot) if rec.snapshot else None
        if source is None and not boot:
            source = await self.golden.path(template, skills)
        await asyncio.to_thread(self._restore, slot, source)
        spec = sandbox_spec(self._layout, self.cgroups, rec.name, slot.dirs, template, skills)
        sock = self._layout.socket(slot.name, rec.run_id)
        slot.process = await start_guest(self.level, spec, rec.name, sock, self.zygote)

    @staticmethod
    def _restore(slot: Slot, source: Path | None) -> None:
        slot.dirs.reset()
        if source is not None:
            restore_snapshot(source, slot.dirs.snapshot_sources(), slot.uid, slot.uid)

    async def _suspend(self, atespace: str, name: str, target: Status, park: bool = False) -> ActorRecord:
        rec = self.get_actor(atespace, name)
        if rec.status is target:
            return await self._keep_held(rec) if rec.held and not park else rec
        if rec.status is Status.RESUMING and self.faults.upstream_transit:
            raise invalid('invalid snapshot URI prefix ""')  # upstream: only a resume gets it out
        slot = self.slots.get(rec.slot) if rec.slot else None
        if (
            slot is None
            or slot.actor != name
            or rec.status in (Status.SUSPENDED, Status.PAUSED, Status.RESUMING)
        ):
            # Nothing runs (a paused actor, or a resume that failed midway): no new snapshot.
            if slot is not None and slot.actor == name and slot.name != rec.held:
                await self._stop_process(slot)
                self.slots.release(slot)
            return self.store.update(rec.evolve(status=target, slot="", run_id=""))
        slot.stopping = True
        going = Status.SUSPENDING if target is Status.SUSPENDED else Status.PAUSING
        if rec.status is not going:
            rec = self.store.update(rec.evolve(status=going), durable=False)
        run_id = rec.run_id
        # Frozen, the sandbox writes nothing while the snapshot is taken, as if it had stopped.
        self._stilling.add(slot.name)
        try:
            kept = target is Status.SUSPENDED and await self._freeze(slot)
            if not kept:
                await self._stop_process(slot)
            slot.stilled = True
        finally:
            self._stilling.discard(slot.name)
            async with self._places:
                self._places.notify_all()
        self.faults.midway("SuspendActor" if target is Status.SUSPENDED else "PauseActor")
        path = self.snapshots.new_path(rec.uid)
        limits = SnapshotLimits.of(self.template(rec).limits)
        try:
            sources = slot.dirs.snapshot_sources()
            dropped, changed = await asyncio.to_thread(self._checkpoint, path, sources, limits, kept and park)
        except Exception as err:
            if kept:
                await self._stop_process(slot, kill=True)
            if isinstance(err, OSError) and err.errno in HOST_ERRNOS:
                raise  # stays SUSPENDING in its slot, files and all: the next suspend or resume retries
            # Whatever the tenant's tree did, never left SUSPENDING holding a slot: back to the
            # last snapshot, as after a pod death.
            self.store.update(rec.evolve(status=target, slot="", run_id="", held=""))
            self.slots.release(slot)
            log.warning("snapshot of %s/%s failed: %s", atespace, name, err)
            raise snapshot_failed(f"{atespace}/{name}", err) from err
        if dropped is None:  # a park: the frozen sandbox holds the files, a snapshot waits until needed
            held = rec.evolve(status=target, slot="", run_id="", held=slot.name, dropped=())
            rec = self.store.update(held, durable=False)
            self.slots.freeze(slot, run_id, rec.snapshot)
            return rec
        rec = self.store.update(rec.evolve(
            status=target, slot="", run_id="", snapshot=str(path), dropped=tuple(dropped), held=""
        ))  # fmt: skip
        self.snapshots.prune(rec.uid, keep=rec.snapshot)
        if kept and not dropped and not changed:
            self.slots.freeze(slot, run_id, str(path))
            return rec
        if kept:  # the resume must find what the snapshot kept: not what it dropped or changed
            await self._stop_process(slot, kill=True)
        self.slots.release(slot)
        return rec

    def _checkpoint(
        self, path: Path, sources: dict[str, Path], limits: SnapshotLimits, defer: bool = False
    ) -> tuple[list[str] | None, bool]:
        """Write the snapshot: the special files it dropped, and whether it changed a mode in the
        tree (a normal user's fleet gives itself read access to what the tenant made unreadable).
        With `defer` (a park keeping the sandbox frozen), only measure the tree, and write nothing
        (None) when a snapshot would keep it exactly: within the limits (SnapshotRefused as a write
        would), nothing left out, no mode to change. Nothing changes a frozen tree, so a snapshot
        written later from it is the same one (_keep_held)."""
        changed: list[str] = []
        token = MODES_CHANGED.set(changed)
        try:
            if defer and measure(sources, limits).exact and not changed:
                return None, False
            return self.snapshots.write(path, sources, limits), bool(changed)
        finally:
            MODES_CHANGED.reset(token)

    def _holder(self, slot: Slot) -> ActorRecord | None:
        """The actor whose held files are in `slot`, if any."""
        rec = self.store.find_name(slot.actor) if slot.actor else None
        return rec if rec is not None and rec.held == slot.name else None

    def _holding(self, rec: ActorRecord) -> Slot | None:
        """The slot keeping `rec`'s held files after its sandbox is gone (Slot.holding), if any."""
        slot = self.slots.get(rec.held) if rec.held else None
        return slot if slot is not None and slot.holding and slot.actor == rec.name else None

    async def _keep_held(self, rec: ActorRecord) -> ActorRecord:
        """Write the files `rec` holds in a slot (ActorRecord.held) as its snapshot, every process
        there stopped (frozen or gone); the record as it is then. Files a snapshot cannot keep (a
        tree over the template's limits) are lost: the actor is back at its last snapshot, and its
        next resume says so (`breach`). A host error is raised and the files stay held: the next
        resume or suspend tries again. One write per actor at a time (eviction, a dead guest's
        watcher and a resume may ask together): a later one finds the files written."""
        name = rec.name
        async with self._kept:
            await self._kept.wait_for(lambda: name not in self._keeping)
            self._keeping.add(name)
        try:
            return await self._write_held(name)
        finally:
            self._keeping.discard(name)
            async with self._kept:
                self._kept.notify_all()

    async def _write_held(self, name: str) -> ActorRecord:
        rec = self.store.find_name(name)
        if rec is None:
            raise not_found(f"actor {name}")
        slot = self.slots.get(rec.held) if rec.held else None
        if slot is None:
            return rec  # written meanwhile
        path = self.snapshots.new_path(rec.uid)
        limits = SnapshotLimits.of(self.template(rec).limits)
        try:
            sources = slot.dirs.snapshot_sources()
            dropped, changed = await asyncio.to_thread(self._checkpoint, path, sources, limits)
        except Exception as err:
            if isinstance(err, OSError) and err.errno in HOST_ERRNOS:
                raise
            log.warning("the files %s/%s held in %s could not be written: %s", rec.atespace, name,
                        slot.name, err)  # fmt: skip
            current = self.store.find_name(name)
            if current is None:
                raise not_found(f"actor {name}") from err
            if current.held != slot.name:
                return current
            lost = f"its files since its last snapshot could not be kept: {err}"
            return self._release_held(slot, self.store.update(current.evolve(held="", breach=lost)))
        current = self.store.find_name(name)
        if current is None or current.uid != rec.uid:  # deleted while it was written
            self.snapshots.delete_actor(rec.uid)
            raise not_found(f"actor {name}")
        if current.held != slot.name:
            self.snapshots.prune(current.uid, keep=current.snapshot)
            return current
        current = self.store.update(current.evolve(snapshot=str(path), dropped=tuple(dropped or ()), held=""))
        self.snapshots.prune(current.uid, keep=current.snapshot)
        if slot.frozen and not slot.stopping:
            slot.snapshot = current.snapshot  # the sandbox is still the actor's latest state
            if dropped or changed:  # unless the snapshot kept less than it holds
                self._spawn(self._evict(slot))
        return self._release_held(slot, current)

    def _release_held(self, slot: Slot, rec: ActorRecord) -> ActorRecord:
        if slot.holding:  # kept only for these files
            self.slots.release(slot)
        return rec

    async def _keep_or_hold(self, rec: ActorRecord, slot: Slot) -> None:
        """_keep_held for a slot whose sandbox is gone, or going: on a host error the slot keeps the
        files (Slot.holding) and is handed out again only once they are written."""
        try:
            await self._keep_held(rec)
        except ControlError:
            pass  # deleted meanwhile: nothing to keep
        except OSError as err:
            log.error("slot %s: the files %s/%s held there could not be written (%s); the slot keeps "
                      "them until they are", slot.name, rec.atespace, rec.name, err)  # fmt: skip
            slot.frozen, slot.holding = False, True

    async def _stop_process(self, slot: Slot, kill: bool = False) -> None:
        """Stop the slot's sandbox: SIGTERM and `stop_grace_s`, or at once with `kill`."""
        slot.stopping = True
        if slot.watcher is not None and slot.watcher is not asyncio.current_task():
            slot.watcher.cancel()
            await asyncio.gather(slot.watcher, return_exceptions=True)
        slot.watcher = None
        if slot.process is not None:
            await (slot.process.reap() if kill else slot.process.stop(self.stop_grace_s))
            slot.process = None

    async def _watch(self, slot: Slot, rec: ActorRecord) -> None:
        """The local "worker pod died": an unexpected guest exit sends the actor back to SUSPENDED
        at its last snapshot, and frees the slot."""
        process = slot.process
        if process is None:
            return
        rc = await process.ended()
        if slot.stopping:
            return
        holder = self._holder(slot)
        if holder is not None:
            slot.stopping = True  # no resume continues it, nor evicts it, while its files are written
        log.warning("guest of %s/%s in %s exited (%s): actor falls back to its %s", rec.atespace, rec.name,
                    slot.name, rc, "files held there" if holder else "last snapshot")  # fmt: skip
        await process.reap()
        current = self.store.get(rec.atespace, rec.name)
        if current is not None and current.run_id == rec.run_id and current.status is Status.RUNNING:
            self.store.update(current.evolve(status=Status.SUSPENDED, slot="", run_id=""))
        if holder is not None:
            await self._keep_or_hold(holder, slot)
        slot.watcher = None
        if not slot.holding:
            self.slots.release(slot)
