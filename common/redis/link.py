"""RedisLink: one pipelined connection to Redis for the queue's hot path (its script calls).

Every job costs the API one script round trip and a worker two. Through redis-py each round trip
cost ~100 µs of client CPU (pool checkout, command packing, parser layers, a task per pipeline);
that was a fifth of the API's CPU per call in bench/e2e.py. This link is the minimum instead:

- one connection per process, shared by every caller; commands are written in order and their
  replies matched in order (Redis answers a connection's commands in the order it got them);
- commands issued in the same event-loop iteration go out in one write (one system call);
- replies are parsed by hiredis, the C parser redis-py itself uses.

`listen()` subscribes to a pub/sub channel the same way, on a connection of its own.

A broken connection fails every command in flight with ConnectionError (callers already retry
those: the queue's scripts are idempotent or fenced) and the next command reconnects. Everything
about the connection (address, TLS, credentials, db, timeouts) comes from `RedisSettings`.

Timeouts cost the commands nothing: one watchdog per connection wakes every quarter of
`socket_timeout` (or every `health_check_interval`), fails the commands in flight with
TimeoutError once the connection has given no reply for `socket_timeout` (plus a blocking
command's block time), and PINGs a connection idle for `health_check_interval`.
"""

from __future__ import annotations

import asyncio
import collections
import math
import socket
from collections.abc import Awaitable, Callable
from typing import Any, cast

import hiredis

from common.redis.errors import ResponseError, connection_failed, reply_error, timed_out
from common.redis.settings import RedisSettings


class Encoded:
    """A run of text arguments laid out once (`resp`: their bulk strings) for commands that send
    them again and again: a script's fleet-wide keys, a session's keys for its whole turn."""

    __slots__ = ("args", "count", "resp")

    def __init__(self, args: tuple[str, ...]) -> None:
        self.args = args
        self.count = len(args)
        self.resp = "".join([f"${len(arg) if arg.isascii() else len(arg.encode())}\r\n{arg}\r\n"
                             for arg in args])


RedisArg = str | int | float | bytes | Encoded


def encode_command(args: tuple[RedisArg, ...]) -> bytes:
    """RESP array of bulk strings (floats as repr, like redis-py).

    The queue's calls are ASCII text and ints (ids, names, JSON without non-ASCII characters):
    those are laid out as one string and encoded once, a third of the CPU of encoding argument
    by argument, which anything else still is."""
    parts: list[str] = []
    count = len(args)
    for arg in args:
        if type(arg) is str and arg.isascii():  # the length in characters is the length in bytes
            text = arg
        elif type(arg) is int:
            text = str(arg)
        elif type(arg) is Encoded:
            parts.append(arg.resp)
            count += arg.count - 1
            continue
        else:
            return _encode_each(args)
        parts.append(f"${len(text)}\r\n{text}\r\n")
    return f"*{count}\r\n{''.join(parts)}".encode()


def _encode_each(args: tuple[RedisArg, ...]) -> bytes:
    parts = [b""]
    count = len(args)
    for arg in args:
        if isinstance(arg, Encoded):
            parts.append(arg.resp.encode())
            count += arg.count - 1
            continue
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, float):
            data = repr(arg).encode()
        else:
            data = str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    parts[0] = b"*%d\r\n" % count
    return b"".join(parts)


def _is_message(reply: Any) -> bool:
    return type(reply) is list and len(reply) == 3 and reply[0] == b"message"


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Done callback of a reply nobody awaits (a health check's): its error is not news."""
    if not future.cancelled():
        future.exception()


class _Protocol(asyncio.Protocol):
    """The connection: an output buffer flushed once per loop iteration, the FIFO of the futures
    awaiting replies, and its watchdog (see the module docstring). On a subscribed connection,
    messages go to `on_push`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, settings: RedisSettings,
                 on_push: Callable[[Any], None] | None = None) -> None:
        self._loop = loop
        self._reader = hiredis.Reader(replyError=ResponseError, encoding=None)
        self._waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._out: list[bytes] = []
        self._transport: asyncio.Transport | None = None
        self._on_push = on_push
        self.closed = False
        #: Done when the connection is gone.
        self.lost: asyncio.Future[None] = loop.create_future()
        #: Block time (s) of the blocking command in flight, which the watchdog allows on top.
        self.blocking_s = 0.0
        self._timeout_s = settings.timeout_s
        self._health_s = settings.health_check_interval_s
        self._tick_s = min(self._health_s or math.inf, (self._timeout_s or math.inf) / 4)
        self._watchdog: asyncio.TimerHandle | None = None
        self._reads = 0  # data_received calls: progress, as the watchdog sees it
        self._reads_seen = 0
        self._quiet_ticks = 0  # ticks since the connection last received anything

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A write transport whatever its class (uvloop's do not subclass asyncio.Transport).
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if self._tick_s != math.inf:
            self._watchdog = self._loop.call_later(self._tick_s, self._tick)

    def send(self, command: bytes) -> asyncio.Future[Any]:
        if self.closed:
            raise connection_failed("connection to Redis lost")
        if not self._out:
            self._loop.call_soon(self._flush)
        self._out.append(command)
        future: asyncio.Future[Any] = self._loop.create_future()
        self._waiting.append(future)
        return future

    def _flush(self) -> None:
        if self._transport is not None and self._out and not self.closed:
            self._transport.write(b"".join(self._out))
        self._out.clear()

    def data_received(self, data: bytes) -> None:
        self._reads += 1
        self._reader.feed(data)
        while (reply := self._reader.gets()) is not False:
            if self._on_push is not None and _is_message(reply):
                self._on_push(reply)
                continue
            if not self._waiting:
                continue  # a reply to a command whose connection was given up on
            future = self._waiting.popleft()
            if future.done():
                continue  # its caller was cancelled; the reply still had to be consumed in order
            if isinstance(reply, ResponseError):
                future.set_exception(reply_error(str(reply)))
            else:
                future.set_result(reply)

    def _tick(self) -> None:
        """The watchdog: time out a connection that stopped answering; PING an idle one."""
        if self._reads != self._reads_seen:
            self._reads_seen = self._reads
            self._quiet_ticks = 0
        else:
            self._quiet_ticks += 1
        quiet_s = self._quiet_ticks * self._tick_s
        if self._waiting:
            # A health check's PING gets the health interval when there is no socket_timeout.
            deadline_s = (self._timeout_s or self._health_s) + self.blocking_s
            if quiet_s > deadline_s:  # one tick late rather than early: the quiet started mid-tick
                self._fail(timed_out(deadline_s))
                return
        elif self._health_s and quiet_s >= self._health_s:
            self.send(encode_command(("PING",))).add_done_callback(_retrieve)
            self._quiet_ticks = 0
        self._watchdog = self._loop.call_later(self._tick_s, self._tick)

    def _fail(self, error: Exception) -> None:
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_exception(error)
        self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        if not self.lost.done():
            self.lost.set_result(None)
        error = connection_failed("connection to Redis lost", exc)
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_exception(error)

    def close(self) -> None:
        # Closed from now on: a command sent before `connection_lost` runs fails at once.
        self.closed = True
        if self._transport is not None:
            self._transport.close()


class RedisLink:
    """Commands over one shared, pipelined connection (see the module docstring)."""

    def __init__(self, settings: RedisSettings) -> None:
        self.settings = settings
        #: Built once: every connection of this link checks the server the same way.
        self._ssl = settings.tls.context() if settings.tls is not None else None
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Task[_Protocol] | None = None

    async def execute(self, *args: RedisArg) -> Any:
        """Send one command; its reply (bytes, int, list, None), or its error (common.redis.errors)."""
        protocol = self._protocol
        if protocol is None or protocol.closed:
            protocol = await self._connection()
        return await protocol.send(encode_command(args))

    async def execute_blocking(self, block_s: float, *args: RedisArg) -> Any:
        """A command that may block `block_s` (0: forever; BLPOP, XREAD BLOCK): the watchdog waits
        that much longer. Only on a link that runs one command at a time (the client's blocking
        links)."""
        protocol = self._protocol
        if protocol is None or protocol.closed:
            protocol = await self._connection()
        protocol.blocking_s = block_s if block_s > 0 else math.inf
        try:
            return await protocol.send(encode_command(args))
        finally:
            protocol.blocking_s = 0.0

    async def listen(self, channel: str, on_message: Callable[[str], None],
                     on_subscribed: Callable[[], Awaitable[None]] | None = None) -> None:
        """Subscribe to `channel` on a connection of its own and hand each message (as text) to
        `on_message`, then `on_subscribed()` once the subscription is confirmed. Never returns:
        raises ConnectionError when the connection drops (the caller resubscribes)."""

        def push(reply: Any) -> None:
            on_message(reply[2].decode())

        protocol = await self._connect(push)
        try:
            await protocol.send(encode_command(("SUBSCRIBE", channel)))
            if on_subscribed is not None:
                await on_subscribed()
            await protocol.lost
        finally:
            protocol.close()
        raise connection_failed(f"subscription to {channel} lost")

    async def aclose(self) -> None:
        connecting, self._connecting = self._connecting, None
        if connecting is not None:
            if not connecting.done():
                connecting.cancel()
            elif not connecting.cancelled() and connecting.exception() is None:
                # Connected, but the calls waiting for it have not run yet: they get it closed.
                connecting.result().close()
        if self._protocol is not None:
            self._protocol.close()
            self._protocol = None

    async def _connection(self) -> _Protocol:
        # Callers arriving while a connect is under way share it.
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        connecting = self._connecting
        try:
            self._protocol = await asyncio.shield(connecting)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if connecting.cancelled() and not (task is not None and task.cancelling()):
                # `aclose` ended the connect this call waited for: the call failed, it was not
                # cancelled (its caller would take a CancelledError for its own cancellation).
                raise connection_failed("the client was closed") from None
            raise
        finally:
            if self._connecting is connecting and connecting.done():
                self._connecting = None
        return self._protocol

    async def _connect(self, on_push: Callable[[Any], None] | None = None) -> _Protocol:
        """A connection, authenticated and on its db, within `socket_connect_timeout`."""
        loop = asyncio.get_running_loop()
        settings = self.settings
        protocol = _Protocol(loop, settings, on_push)
        try:
            async with asyncio.timeout(settings.connect_timeout_s):
                if settings.unix_path is not None:
                    await loop.create_unix_connection(lambda: protocol, settings.unix_path)
                else:
                    await loop.create_connection(lambda: protocol, settings.host, settings.port,
                                                 ssl=self._ssl)
                if settings.password:
                    user = (settings.username,) if settings.username else ()
                    await protocol.send(encode_command(("AUTH", *user, settings.password)))
                if settings.db:
                    await protocol.send(encode_command(("SELECT", settings.db)))
        except (OSError, TimeoutError) as err:
            protocol.close()
            raise connection_failed("cannot connect to Redis", err) from err
        except BaseException:
            protocol.close()
            raise
        return protocol

