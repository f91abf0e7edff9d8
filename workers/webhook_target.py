"""Where a webhook may be sent: the SSRF guard and the pinned-address HTTP transport.

A callback URL comes from a client, so the deliverer must not become a way to reach the fleet's
own network. Before each attempt the host is resolved and every candidate address is checked:
private, loopback, link-local, multicast, reserved, unspecified and other non-global addresses are
refused unless `webhooks.allow_private_targets` is set. The connection then goes to the address
that was checked (the request is sent to that IP, with the original `Host` header and TLS server
name), so a DNS answer that changes between check and connect (rebinding) cannot redirect it.

Connections are kept alive per (host name, checked IP), never shared between host names (see
`PinnedTransport`). Redirects are never followed (the client is built with
`follow_redirects=False`; a 3xx is just an unsuccessful answer).

Errors: `TargetRefused` (permanent: the URL or its addresses are not allowed) is raised by the
transport before any connection is made; network failures surface as `httpx.TransportError`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import time
from dataclasses import dataclass

import httpx

from common.config import WebhookConfig

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Schemes a callback may use.
ALLOWED_SCHEMES = ("http", "https")

#: A host's connection pool is closed after this many request timeouts without use.
IDLE_CLOSE_FACTOR = 4

#: Identifies the sender to receivers.
USER_AGENT = "atefleet-webhooks/1"


class TargetRefused(Exception):
    """The callback URL may not be contacted (scheme, unresolvable host or forbidden address)."""


def forbidden_reason(ip: IPAddress) -> str | None:
    """Why `ip` is not a public unicast address, or None when it is one."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        # ::ffff:127.0.0.1 reaches 127.0.0.1; judge the address actually connected to.
        ip = ip.ipv4_mapped
    checks = (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("private", ip.is_private),
        ("reserved", ip.is_reserved),
        # Catches what the flags above miss, e.g. shared address space 100.64.0.0/10.
        ("non-global", not ip.is_global),
    )
    return next((name for name, hit in checks if hit), None)


async def resolve(host: str, port: int) -> list[IPAddress]:
    """The addresses `host` resolves to (an IP literal resolves to itself), in resolver order."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise TargetRefused(f"cannot resolve {host!r}: {err.strerror}") from err
    # The scope suffix of a link-local IPv6 answer ("fe80::1%eth0") is not part of the address.
    addresses = [ipaddress.ip_address(str(info[4][0]).partition("%")[0]) for info in infos]
    return list(dict.fromkeys(addresses))


async def pick_address(url: httpx.URL, allow_private: bool) -> IPAddress:
    """The checked address to connect to for `url`, or TargetRefused.

    The first allowed address is used: since the connection is pinned to it, other (refused)
    answers of the same name are never contacted.
    """
    if url.scheme not in ALLOWED_SCHEMES:
        raise TargetRefused(f"scheme {url.scheme!r} is not allowed (http or https only)")
    if not url.host:
        raise TargetRefused("callback URL has no host")
    port = url.port or (443 if url.scheme == "https" else 80)
    addresses = await resolve(url.host, port)
    if allow_private:
        return addresses[0]
    reasons = [(ip, forbidden_reason(ip)) for ip in addresses]
    allowed = [ip for ip, reason in reasons if reason is None]
    if not allowed:
        detail = ", ".join(f"{ip} ({reason})" for ip, reason in reasons)
        raise TargetRefused(f"{url.host} resolves only to refused addresses: {detail}")
    return allowed[0]


@dataclass
class _Pool:
    """Connections of one (scheme, host name, port, checked IP): only ever used for that name."""

    transport: httpx.AsyncHTTPTransport
    last_used_s: float


class PinnedTransport(httpx.AsyncBaseTransport):
    """Sends each request to the checked address of its host, keeping Host and TLS server name.

    Connections are kept alive in one pool per (scheme, host name, port, IP): a pool keyed by IP
    alone could hand a connection opened (and TLS-verified) for one name to a request for another.
    A pool unused for `idle_close_s` is closed; it can have no request in flight by then because
    every request is shorter than that.
    """

    def __init__(self, allow_private: bool, idle_close_s: float, trust: ssl.SSLContext | None = None) -> None:
        """`trust` verifies receivers' certificates (default: httpx's, the certifi CA bundle)."""
        self._allow_private = allow_private
        self._idle_close_s = idle_close_s
        # One context for every pool: loading the CA bundle is the costly part.
        self._trust = trust or httpx.create_ssl_context()
        self._pools: dict[tuple[str, str, int, str], _Pool] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        ip = await pick_address(url, self._allow_private)
        extensions = dict(request.extensions)
        if url.scheme == "https" and not _is_ip_literal(url.host):
            extensions["sni_hostname"] = url.host
        # httpx.Request set the Host header from the original URL already; it is kept as is.
        pinned = httpx.Request(
            request.method,
            url.copy_with(host=str(ip)),
            headers=request.headers,
            stream=request.stream,
            extensions=extensions,
        )
        pool = await self._pool((url.scheme, url.host, url.port or 0, str(ip)))
        return await pool.transport.handle_async_request(pinned)

    async def _pool(self, key: tuple[str, str, int, str]) -> _Pool:
        now = time.monotonic()
        idle = [k for k, p in self._pools.items() if now - p.last_used_s > self._idle_close_s and k != key]
        for k in idle:
            await self._pools.pop(k).transport.aclose()
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool(httpx.AsyncHTTPTransport(verify=self._trust), now)
        pool.last_used_s = now
        return pool

    async def aclose(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.transport.aclose()


def make_client(config: WebhookConfig) -> httpx.AsyncClient:
    """The deliverer's HTTP client: pinned, guarded, no redirects, the configured timeout."""
    return httpx.AsyncClient(
        transport=PinnedTransport(config.allow_private_targets, IDLE_CLOSE_FACTOR * config.timeout_s),
        follow_redirects=False,
        timeout=httpx.Timeout(config.timeout_s),
        headers={"user-agent": USER_AGENT},
    )


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
