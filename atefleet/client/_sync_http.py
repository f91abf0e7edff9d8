"""The sync client's HTTP/1.1 transport: blocking sockets and the same httptools parser as the
async one, keep-alive, thread-safe.

Why not httpx, urllib3 or http.client: a sync call's client overhead is on every agent step, and
bench/sdk.py's latency figure is the SDK's p50 over the minimal client's. http.client (the
cheapest of those three) still parses headers with the email package; a request here is one
`sendall` and the answer is parsed in C. Connections are kept in a LIFO pool, so threads sharing
one `Client` each get their own.

Errors are builtin ones, translated by the caller (`atefleet.client.errors`): OSError (connect,
reset), TimeoutError (no data for `timeout_s`), and ProtocolError.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator, Mapping

from atefleet.client._wire import Pool, Request, Response, ResponseParser, request_bytes

#: Idle connections kept per client.
MAX_IDLE = 32

#: Bytes asked of the socket per read.
READ_BYTES = 65536


class _Conn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.parser = ResponseParser()
        self.timeout_s: float | None = None

    def set_timeout(self, timeout_s: float) -> None:
        if timeout_s != self.timeout_s:  # a syscall saved on the common path (same timeout)
            self.sock.settimeout(timeout_s)
            self.timeout_s = timeout_s

    def read_some(self) -> None:
        """One read from the socket into the parser (TimeoutError when none comes in time)."""
        data = self.sock.recv(READ_BYTES)
        if data:
            self.parser.feed(data)
        else:
            self.parser.eof()


class SyncTransport(Pool[_Conn]):
    """Requests to one API base URL over a pool of keep-alive connections."""

    def __init__(self, base_url: str, headers: Mapping[str, str], tls: ssl.SSLContext | None,
                 connect_timeout_s: float) -> None:
        super().__init__(base_url, headers, tls, connect_timeout_s)
        self._lock = threading.Lock()

    def _connect(self) -> _Conn:
        sock = socket.create_connection((self._host, self._port), timeout=self._connect_timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._tls is not None:
            sock = self._tls.wrap_socket(sock, server_hostname=self._host)
        return _Conn(sock)

    def _take(self) -> _Conn | None:
        with self._lock:
            return self._idle.pop() if self._idle else None

    def _give_back(self, conn: _Conn) -> None:
        if conn.parser.keep_alive:
            with self._lock:
                if len(self._idle) < MAX_IDLE:
                    self._idle.append(conn)
                    return
        conn.sock.close()

    def _open(self, request: Request, timeout_s: float) -> _Conn:
        """A connection whose answer's head is in."""
        data = request_bytes(request, self._fixed)
        while True:
            kept = self._take()
            conn = kept or self._connect()
            try:
                conn.set_timeout(timeout_s)
                conn.parser.reset()
                conn.sock.sendall(data)
                while not conn.parser.head_done:
                    conn.read_some()
                return conn
            except (BrokenPipeError, ConnectionResetError):
                conn.sock.close()
                if kept is None or conn.parser.head_done:
                    raise
                # A kept connection the API closed while it sat idle: nothing reached it, so
                # sending the request again on a fresh one is safe whatever the method.
            except BaseException:
                conn.sock.close()
                raise

    def send(self, request: Request, timeout_s: float) -> Response:
        conn = self._open(request, timeout_s)
        try:
            while not conn.parser.complete:
                conn.read_some()
        except BaseException:
            conn.sock.close()
            raise
        parser = conn.parser
        response = Response(parser.status, parser.headers, b"".join(parser.take_chunks()))
        self._give_back(conn)
        return response

    def stream(self, request: Request, timeout_s: float) -> tuple[Response, Iterator[bytes]]:
        """The answer's head and an iterator over its body (`timeout_s` between reads); close
        the iterator to let go early."""
        conn = self._open(request, timeout_s)

        def body() -> Iterator[bytes]:
            try:
                while True:
                    yield from conn.parser.take_chunks()
                    if conn.parser.complete:
                        break
                    conn.read_some()
            except BaseException:
                conn.sock.close()
                raise
            self._give_back(conn)

        return Response(conn.parser.status, conn.parser.headers, b""), body()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.sock.close()
