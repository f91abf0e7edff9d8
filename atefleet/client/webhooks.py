"""Standard Webhooks signatures: how atefleet signs its callbacks and how a receiver checks them.

This is the SDK's module (receivers install `atefleet-client` alone); the fleet's webhook sender
imports `sign` from it through `common.webhook_signing`.

Every callback carries three headers (https://www.standardwebhooks.com/):

- `webhook-id`: the message id, the same on every retry of one callback (use it to deduplicate);
- `webhook-timestamp`: unix seconds of this attempt;
- `webhook-signature`: `v1,<base64 HMAC-SHA256>` over `"{id}.{timestamp}.{body}"`, keyed with the
  bytes of the secret (`whsec_<base64>`); several space-separated signatures may appear while a
  secret is being rotated, and one matching is enough.

A receiver verifies the raw request body (bytes exactly as received, before any JSON parsing)::

    from atefleet.client import WebhookVerificationError, verify_webhook

    try:
        event = verify_webhook(request.headers, raw_body, "whsec_...")
    except WebhookVerificationError:
        return Response(status_code=400)
    # event: {"type": "job.completed", "timestamp": ..., "data": {job}}

`verify` rejects a missing header, a timestamp further than `tolerance_s` from now (either way,
which bounds replays) and a signature that does not match. Any Standard Webhooks library (svix,
standardwebhooks) verifies the same callbacks.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any

#: Prefix of a signing secret; the rest is the base64 of the key bytes.
SECRET_PREFIX = "whsec_"

#: The only signature scheme the spec defines for symmetric keys.
SIGNATURE_VERSION = "v1"

#: Default replay window (seconds) between the sender's timestamp and the receiver's clock.
DEFAULT_TOLERANCE_S = 300

#: Headers every callback carries, in the order `verify` reads them.
_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")


class WebhookVerificationError(Exception):
    """The callback is not authentic or not fresh; the message says which check failed."""


def secret_key(secret: str) -> bytes:
    """The HMAC key of a `whsec_<base64>` secret (the prefix is optional, as in the reference libraries)."""
    encoded = secret.removeprefix(SECRET_PREFIX)
    try:
        return base64.b64decode(encoded, validate=True)
    except binascii.Error as err:
        raise ValueError("webhook secret is not whsec_ followed by base64") from err


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value, `v1,<base64 HMAC-SHA256 of "id.timestamp.body">`."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return f"{SIGNATURE_VERSION},{base64.b64encode(digest).decode()}"


def verify(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> None:
    """Check a received callback; raise WebhookVerificationError unless it is authentic and fresh.

    `headers` may be any mapping (header names are matched case-insensitively); `body` must be the
    raw bytes received.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    msg_id, timestamp, signatures = (_header(lowered, name) for name in _HEADERS)
    sent_at = _parse_timestamp(timestamp)
    if abs(time.time() - sent_at) > tolerance_s:
        raise WebhookVerificationError("webhook-timestamp is outside the tolerance window")
    expected = sign(secret, msg_id, sent_at, body).encode()
    # Compare each candidate in constant time; unknown versions are ignored, as the spec says.
    for candidate in signatures.split():
        version, _, _ = candidate.partition(",")
        if version == SIGNATURE_VERSION and hmac.compare_digest(candidate.encode(), expected):
            return
    raise WebhookVerificationError("no webhook-signature matches")


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if not value:
        raise WebhookVerificationError(f"missing {name} header")
    return value


def _parse_timestamp(value: str) -> int:
    try:
        return int(value)
    except ValueError as err:
        raise WebhookVerificationError("webhook-timestamp is not an integer") from err


def verify_webhook(headers: Mapping[str, str], body: bytes, secret: str,
                   tolerance_s: float = DEFAULT_TOLERANCE_S) -> dict[str, Any]:
    """The callback's event (`{"type", "timestamp", "data": {job}}`) once `verify` accepts it."""
    verify(secret, headers, body, tolerance_s)
    try:
        event = json.loads(body)
    except ValueError as err:
        raise WebhookVerificationError("the signed body is not JSON") from err
    if not isinstance(event, dict):
        raise WebhookVerificationError("the signed body is not a JSON object")
    return event
