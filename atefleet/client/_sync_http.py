"""The sync client's HTTP/1.1 transport: the standard library's http.client, keep-alive, thread-safe.

Why not httpx or urllib3: a sync call's client overhead is on every agent step. bench/sdk.py
compares them; http.client's request/response cycle costs less CPU than either, TLS and chunked
answers included, and adds no dependency. Connections are kept in a LIFO pool, so threads sharing
one `Client` each get their own.

Errors are builtin ones, translated by the caller (`atefleet.client.errors`): OSError (connect,
reset; http.client's RemoteDisconnected is one), TimeoutError, and ProtocolError.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit

from atefleet.client._wire import ProtocolError, Request, Response, check_request

#: Idle connections kept per client.
MAX_IDLE = 32

#: Bytes read per step of a streamed answer.
STREAM_READ_BYTES = 65536


class SyncTransport:
    """Requests to one API base URL over a pool of keep-alive connections."""

    def __init__(self, base_url: str, tls: ssl.SSLContext | None, connect_timeout_s: float) -> None:
        url = urlsplit(base_url)
        self._https = url.scheme == "https"
        self._host = url.hostname or "127.0.0.1"
        self._port = url.port or (443 if self._https else 80)
        self._tls = (tls or ssl.create_default_context()) if self._https else None
        self._connect_timeout_s = connect_timeout_s
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _connect(self) -> http.client.HTTPConnection:
        if self._https:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                self._host, self._port, timeout=self._connect_timeout_s, context=self._tls)
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self._connect_timeout_s)
        conn.connect()
        if conn.sock is not None:
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._connect(), False

    def _give_back(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        if response.will_close:
            conn.close()
            return
        with self._lock:
            if len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def _open(self, request: Request, timeout_s: float) -> tuple[http.client.HTTPConnection,
                                                                  http.client.HTTPResponse]:
        check_request(request)
        while True:
            conn, reused = self._take()
            try:
                conn.timeout = timeout_s
                if conn.sock is not None:
                    conn.sock.settimeout(timeout_s)
                # A bytes body goes out in the same send as the head (http.client joins them).
                conn.putrequest(request.method, request.target, skip_host=True, skip_accept_encoding=True)
                for name, value in request.headers.items():
                    conn.putheader(name, value)
                if request.body is not None:
                    conn.putheader("content-type", "application/json")
                conn.putheader("content-length", str(len(request.body or b"")))
                conn.endheaders(request.body)
                return conn, conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                conn.close()
                if not reused:
                    raise
                # A kept connection the API closed while it sat idle: the request never reached
                # it, so sending it again on a fresh one is safe whatever the method.
            except http.client.HTTPException as err:
                conn.close()
                raise ProtocolError(f"malformed answer from the API: {err!r}") from err
            except BaseException:
                conn.close()
                raise

    def send(self, request: Request, timeout_s: float) -> Response:
        conn, response = self._open(request, timeout_s)
        try:
            body = response.read()
        except BaseException:
            conn.close()
            raise
        self._give_back(conn, response)
        return Response(response.status, {k.lower(): v for k, v in response.getheaders()}, body)

    def stream(self, request: Request, timeout_s: float) -> tuple[Response, Iterator[bytes]]:
        """The answer's head and an iterator over its body; close the iterator to let go early."""
        conn, response = self._open(request, timeout_s)
        head = Response(response.status, {k.lower(): v for k, v in response.getheaders()}, b"")

        def body() -> Iterator[bytes]:
            try:
                while chunk := response.read1(STREAM_READ_BYTES):
                    yield chunk
            except BaseException:
                conn.close()
                raise
            self._give_back(conn, response)

        return head, body()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
