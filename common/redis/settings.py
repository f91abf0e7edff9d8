"""RedisSettings: how to reach Redis, parsed once from the URL at start.

    redis://[[user]:password@]host[:port][/db][?option=value&...]
    rediss://...                       (TLS)
    unix://[[user]:password@]/path/to/socket[?db=N&...]

Query options carry redis-py's names, so one URL means the same to the fleet's client and to
redis-py (arq, and the tests' second implementation):

    db                       database number (also the URL path for redis:// and rediss://)
    socket_connect_timeout   seconds to connect (and authenticate)
    socket_timeout           seconds any one operation may wait for its reply (blocking
                             commands: on top of their block time); none by default
    health_check_interval    seconds a connection may sit idle before it is checked with a PING
    ssl_ca_certs             CA file (PEM) to verify the server with; default: the system's
    ssl_ca_data              CA certificates (PEM text), in addition to `ssl_ca_certs`
    ssl_certfile             client certificate (PEM), for servers that ask for one
    ssl_keyfile              its private key (default: in `ssl_certfile`)
    ssl_password             the private key's password
    ssl_cert_reqs            required (default), optional or none
    ssl_check_hostname       true (default; false when ssl_cert_reqs=none) or false

Any other option, a TLS option on a plain URL, or a value that does not parse is refused with
a `RedisSettingsError` naming it: a typo must not silently weaken TLS or drop a timeout.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast
from urllib.parse import parse_qsl, unquote, urlsplit

from redis.asyncio import ConnectionPool
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection

CertReqs = Literal["required", "optional", "none"]

#: Connect timeout (s) when the URL sets none: a Redis that does not answer is an outage.
DEFAULT_CONNECT_TIMEOUT_S = 10.0
#: Health check interval (s) when the URL sets none: an idle connection is PINGed this often, so
#: a connection a firewall or a failover dropped silently is found before a caller needs it.
DEFAULT_HEALTH_CHECK_INTERVAL_S = 30.0

_CERT_REQS: dict[str, ssl.VerifyMode] = {
    "required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE,
}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class RedisSettingsError(ValueError):
    """The Redis URL cannot be used as given; the message names the part at fault."""


@dataclass(frozen=True)
class TlsSettings:
    """How a `rediss://` connection checks the server and presents itself."""

    ca_file: str | None = None
    ca_data: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    key_password: str | None = None
    cert_reqs: CertReqs = "required"
    check_hostname: bool = True

    def context(self) -> ssl.SSLContext:
        """The SSL context every TLS connection of the fleet's client uses."""
        context = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_data)
        context.check_hostname = self.check_hostname
        context.verify_mode = _CERT_REQS[self.cert_reqs]
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file, self.key_password)
        return context

    def __repr__(self) -> str:
        shown = "***" if self.key_password else None
        return (f"TlsSettings(ca_file={self.ca_file!r}, ca_data={'...' if self.ca_data else None}, "
                f"cert_file={self.cert_file!r}, key_file={self.key_file!r}, key_password={shown}, "
                f"cert_reqs={self.cert_reqs!r}, check_hostname={self.check_hostname})")


@dataclass(frozen=True)
class RedisSettings:
    """Where Redis is, who we are to it, and how long we wait for it (see the module docstring)."""

    host: str = "localhost"
    port: int = 6379
    #: A unix socket path instead of host and port.
    unix_path: str | None = None
    username: str | None = None
    password: str | None = None
    db: int = 0
    #: None: plain TCP (or the unix socket).
    tls: TlsSettings | None = None
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    #: None: an operation waits for its reply as long as the connection stands.
    timeout_s: float | None = None
    #: 0: idle connections are not checked.
    health_check_interval_s: float = DEFAULT_HEALTH_CHECK_INTERVAL_S

    @classmethod
    def from_url(cls, url: str) -> RedisSettings:
        """Parse `url`; raises RedisSettingsError naming what it cannot use."""
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise RedisSettingsError(f"Redis URL scheme {parts.scheme!r} is not one of redis://, rediss://, unix://")
        options = _options(parts.query)
        if parts.scheme != "rediss":
            stray = sorted(name for name in options if name.startswith("ssl_"))
            if stray:
                raise RedisSettingsError(f"Redis URL option {stray[0]!r} needs a rediss:// URL")
        where: dict[str, Any] = {}
        if parts.scheme == "unix":
            if not parts.path:
                raise RedisSettingsError("Redis URL unix:// names no socket path")
            where["unix_path"] = unquote(parts.path)
        else:
            where["host"] = parts.hostname or "localhost"
            where["port"] = _port(parts)
            where["tls"] = _tls(options) if parts.scheme == "rediss" else None
            path_db = unquote(parts.path).strip("/")
            if path_db:
                where["db"] = _number("database (URL path)", path_db, int)
        return cls(
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            **where, **_common(options),
        )

    def connection_pool(self, max_connections: int | None = None) -> ConnectionPool:
        """A redis-py pool over the same settings, for code that needs redis-py itself (arq).

        redis-py's asyncio client cannot open a password-protected client key, so settings with
        `ssl_password` are refused here rather than failing at the first connection."""
        kwargs: dict[str, Any] = {
            "username": self.username, "password": self.password, "db": self.db,
            "socket_connect_timeout": self.connect_timeout_s, "socket_timeout": self.timeout_s,
            "health_check_interval": self.health_check_interval_s, "socket_keepalive": True,
        }
        connection_class: type[Connection] | type[UnixDomainSocketConnection] = Connection
        if self.unix_path is not None:
            connection_class = UnixDomainSocketConnection
            kwargs["path"] = self.unix_path
        else:
            kwargs.update(host=self.host, port=self.port)
        if self.tls is not None:
            if self.tls.key_password:
                raise RedisSettingsError("Redis URL option 'ssl_password' is not supported by redis-py's "
                                         "asyncio client (arq); use an unencrypted client key")
            connection_class = SSLConnection
            kwargs.update(ssl_ca_certs=self.tls.ca_file, ssl_ca_data=self.tls.ca_data,
                          ssl_certfile=self.tls.cert_file, ssl_keyfile=self.tls.key_file,
                          ssl_cert_reqs=self.tls.cert_reqs, ssl_check_hostname=self.tls.check_hostname)
        return ConnectionPool(connection_class=connection_class, max_connections=max_connections, **kwargs)

    def __repr__(self) -> str:
        where = f"unix_path={self.unix_path!r}" if self.unix_path else f"host={self.host!r}, port={self.port}"
        password = "***" if self.password else None
        return (f"RedisSettings({where}, username={self.username!r}, password={password}, db={self.db}, "
                f"tls={self.tls!r}, connect_timeout_s={self.connect_timeout_s}, "
                f"timeout_s={self.timeout_s}, health_check_interval_s={self.health_check_interval_s})")


def _options(query: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if name not in _KNOWN_OPTIONS:
            known = ", ".join(sorted(_KNOWN_OPTIONS))
            raise RedisSettingsError(f"Redis URL option {name!r} is not supported (supported: {known})")
        if name in options:
            raise RedisSettingsError(f"Redis URL option {name!r} is given twice")
        options[name] = value
    return options


def _port(parts: Any) -> int:
    try:
        return int(parts.port or 6379)
    except ValueError as err:
        raise RedisSettingsError(f"Redis URL port: {err}") from None


def _number(name: str, value: str, kind: Callable[[str], Any], *, positive: bool = False) -> Any:
    try:
        number = kind(value)
    except ValueError:
        raise RedisSettingsError(f"Redis URL option {name!r}: {value!r} is not a number") from None
    if number < 0 or (positive and number == 0):
        least = "above" if positive else "at least"
        raise RedisSettingsError(f"Redis URL option {name!r}: {value!r} must be {least} 0")
    return number


def _flag(name: str, value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise RedisSettingsError(f"Redis URL option {name!r}: {value!r} is not true or false")


#: Options that apply to every scheme: (settings field, type, must be above 0).
_COMMON_OPTIONS: dict[str, tuple[str, Callable[[str], Any], bool]] = {
    "db": ("db", int, False),
    "socket_connect_timeout": ("connect_timeout_s", float, True),
    "socket_timeout": ("timeout_s", float, True),
    "health_check_interval": ("health_check_interval_s", float, False),
}


def _common(options: dict[str, str]) -> dict[str, Any]:
    return {
        field: _number(name, options[name], kind, positive=positive)
        for name, (field, kind, positive) in _COMMON_OPTIONS.items() if name in options
    }


def _tls(options: dict[str, str]) -> TlsSettings:
    cert_reqs = options.get("ssl_cert_reqs", "required").lower()
    if cert_reqs not in _CERT_REQS:
        raise RedisSettingsError(f"Redis URL option 'ssl_cert_reqs': {cert_reqs!r} is not one of "
                                 "required, optional, none")
    check_hostname = cert_reqs != "none"
    if "ssl_check_hostname" in options:
        check_hostname = _flag("ssl_check_hostname", options["ssl_check_hostname"])
        if check_hostname and cert_reqs == "none":
            raise RedisSettingsError("Redis URL options: ssl_check_hostname=true needs a verified "
                                     "certificate, not ssl_cert_reqs=none")
    if options.get("ssl_keyfile") and not options.get("ssl_certfile"):
        raise RedisSettingsError("Redis URL option 'ssl_keyfile' needs 'ssl_certfile'")
    if options.get("ssl_password") and not options.get("ssl_certfile"):
        raise RedisSettingsError("Redis URL option 'ssl_password' needs 'ssl_certfile'")
    return TlsSettings(
        ca_file=options.get("ssl_ca_certs") or None, ca_data=options.get("ssl_ca_data") or None,
        cert_file=options.get("ssl_certfile") or None, key_file=options.get("ssl_keyfile") or None,
        key_password=options.get("ssl_password") or None,
        cert_reqs=cast(CertReqs, cert_reqs),  # checked against _CERT_REQS above
        check_hostname=check_hostname,
    )


_KNOWN_OPTIONS = frozenset({
    "db", "socket_connect_timeout", "socket_timeout", "health_check_interval",
    "ssl_ca_certs", "ssl_ca_data", "ssl_certfile", "ssl_keyfile", "ssl_password", "ssl_cert_reqs",
    "ssl_check_hostname",
})


def role_settings(role: str, url: str) -> RedisSettings:
    """The settings `atefleet <role>` starts with, or SystemExit saying what is wrong with its URL."""
    if not url:
        raise SystemExit(f"atefleet {role}: redis.url (or $ATEFLEET_REDIS_URL) is required; "
                         "`atefleet up` starts an embedded Redis")
    try:
        return RedisSettings.from_url(url)
    except RedisSettingsError as err:
        raise SystemExit(f"atefleet {role}: redis.url: {err}") from None
