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
those: the queue's scripts are idempotent or fenced) and the next command reconnects. Connection
settings (host, port or unix path, TLS, username, password, db) are the redis-py client's own.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, cast

import hiredis
from redis._parsers.base import BaseParser  # redis-py's own error-code mapping (redis pinned < 6)
from redis.asyncio import Redis
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

RedisArg = str | int | float | bytes


def encode_command(args: tuple[RedisArg, ...]) -> bytes:
    """RESP array of bulk strings (floats as repr, like redis-py).

    The queue's calls are ASCII text and ints (ids, names, JSON without non-ASCII characters):
    those are laid out as one string and encoded once, a third of the CPU of encoding argument
    by argument, which anything else still is."""
    parts: list[str] = []
    for arg in args:
        if type(arg) is str and arg.isascii():  # the length in characters is the length in bytes
            text = arg
        elif type(arg) is int:
            text = str(arg)
        else:
            return _encode_each(args)
        parts.append(f"${len(text)}\r\n{text}\r\n")
    return f"*{len(args)}\r\n{''.join(parts)}".encode()


def _encode_each(args: tuple[RedisArg, ...]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, float):
            data = repr(arg).encode()
        else:
            data = str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def reply_error(message: str) -> ResponseError:
    """An error reply as redis-py raises it, by its code: NOSCRIPT as NoScriptError, LOADING (a
    restarted Redis still reading its AOF) as BusyLoadingError, a ConnectionError, so callers
    retry it like an outage and the API answers 503, not 500."""
    error: ResponseError = BaseParser.parse_error(message)  # type: ignore[no-untyped-call]
    return error


class _Protocol(asyncio.Protocol):
    """The connection: an output buffer flushed once per loop iteration, and the FIFO of the
    futures awaiting replies. Replies nobody awaits (pub/sub pushes) go to `on_push`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_push: Callable[[Any], None] | None = None) -> None:
        self._loop = loop
        self._reader = hiredis.Reader(replyError=ResponseError, encoding=None)
        self._waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self._out: list[bytes] = []
        self._transport: asyncio.Transport | None = None
        self._on_push = on_push
        self.closed = False
        #: Done when the connection is gone.
        self.lost: asyncio.Future[None] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A write transport whatever its class (uvloop's do not subclass asyncio.Transport).
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)

    def send(self, command: bytes) -> asyncio.Future[Any]:
        if self.closed:
            raise RedisConnectionError("connection to Redis lost")
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
        self._reader.feed(data)
        while (reply := self._reader.gets()) is not False:
            if not self._waiting:
                if self._on_push is not None:
                    self._on_push(reply)
                continue
            future = self._waiting.popleft()
            if future.done():
                continue  # its caller was cancelled; the reply still had to be consumed in order
            if isinstance(reply, ResponseError):
                future.set_exception(reply_error(str(reply)))
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.lost.done():
            self.lost.set_result(None)
        error = RedisConnectionError(f"connection to Redis lost: {exc or 'closed'}")
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_exception(error)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class RedisLink:
    """Commands over one shared, pipelined connection (see the module docstring)."""

    def __init__(self, redis: Redis) -> None:
        pool = redis.connection_pool
        self._kwargs: dict[str, Any] = dict(pool.connection_kwargs)
        self._unix = issubclass(pool.connection_class, UnixDomainSocketConnection)
        self._tls = issubclass(pool.connection_class, SSLConnection)
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Task[_Protocol] | None = None

    async def execute(self, *args: RedisArg) -> Any:
        """Send one command; its reply (bytes, int, list, None), or its error as ResponseError."""
        protocol = self._protocol
        if protocol is None or protocol.closed:
            protocol = await self._connection()
        return await protocol.send(encode_command(args))

    async def listen(self, channel: str, on_message: Callable[[str], None],
                     on_subscribed: Callable[[], Awaitable[None]] | None = None) -> None:
        """Subscribe to `channel` on a connection of its own and hand each message (as text) to
        `on_message`, then `on_subscribed()` once the subscription is confirmed. Never returns:
        raises ConnectionError when the connection drops (the caller resubscribes)."""

        def push(reply: Any) -> None:
            if isinstance(reply, list) and len(reply) == 3 and reply[0] == b"message":
                on_message(reply[2].decode())

        protocol = await self._connect(push)
        try:
            await protocol.send(encode_command(("SUBSCRIBE", channel)))
            if on_subscribed is not None:
                await on_subscribed()
            await protocol.lost
        finally:
            protocol.close()
        raise RedisConnectionError(f"subscription to {channel} lost")

    async def aclose(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()
            self._connecting = None
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
        finally:
            if self._connecting is connecting and connecting.done():
                self._connecting = None
        return self._protocol

    async def _connect(self, on_push: Callable[[Any], None] | None = None) -> _Protocol:
        loop = asyncio.get_running_loop()
        kw = self._kwargs
        timeout_s = kw.get("socket_connect_timeout") or kw.get("socket_timeout") or 10.0
        protocol = _Protocol(loop, on_push)
        try:
            async with asyncio.timeout(timeout_s):
                if self._unix:
                    await loop.create_unix_connection(lambda: protocol, kw["path"])
                else:
                    await loop.create_connection(lambda: protocol, kw.get("host", "localhost"),
                                                 kw.get("port", 6379), ssl=self._ssl_context())
        except (OSError, TimeoutError) as err:
            raise RedisConnectionError(f"cannot connect to Redis: {err!r}") from err
        try:
            if kw.get("password"):
                user = (kw["username"],) if kw.get("username") else ()
                await protocol.send(encode_command(("AUTH", *user, kw["password"])))
            if kw.get("db"):
                await protocol.send(encode_command(("SELECT", kw["db"])))
        except BaseException:
            protocol.close()
            raise
        return protocol

    def _ssl_context(self) -> ssl.SSLContext | None:
        if not self._tls:
            return None
        kw = self._kwargs
        context = ssl.create_default_context(cafile=kw.get("ssl_ca_certs"))
        if kw.get("ssl_certfile"):
            context.load_cert_chain(kw["ssl_certfile"], kw.get("ssl_keyfile"))
        if kw.get("ssl_cert_reqs") in ("none", ssl.CERT_NONE):
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context
