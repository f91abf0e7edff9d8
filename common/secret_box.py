"""Sealing per-call secrets (env var values) between the API and the worker.

The API and the workers only talk through Redis, so a call's env vars must pass through it. They
pass sealed (AES-256-GCM under a fleet key that Redis never sees), so neither Redis's memory, its
AOF, nor a backup of it ever holds a secret in the clear; the sealed blob is also deleted as soon
as the worker has taken it. The key comes from $ATEFLEET_SECRETS_KEY (base64 of 32 bytes; a
Kubernetes Secret in a cluster) or, on one host, from `<state_dir>/secrets.key` (0600, made once).
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

#: The one key of a job's `secrets` mapping: its value is the sealed env variables.
SEALED_ENV_KEY = "env_sealed"
#: Environment variable holding the base64 fleet key.
KEY_ENV = "ATEFLEET_SECRETS_KEY"
NONCE_BYTES = 12
#: Associated data: binds a sealed blob to its purpose (it cannot be replayed as something else).
_AAD = b"atefleet:env_variables:v1"


class SecretError(Exception):
    """A sealed blob could not be opened (wrong key or tampered)."""


def load_key(state_dir: str | Path, environ: Mapping[str, str] | None = None) -> bytes:
    """The fleet key: from the environment, else the state dir's key file (created if absent)."""
    env = os.environ if environ is None else environ
    if env.get(KEY_ENV):
        key = base64.b64decode(env[KEY_ENV])
        if len(key) != 32:
            raise SecretError(f"${KEY_ENV} must be base64 of 32 bytes")
        return key
    path = Path(state_dir) / "secrets.key"
    if not path.exists():
        # Written whole to a temp file, then linked into place: a process starting at the same
        # moment either sees no file or the complete key, and exactly one key wins the link.
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".secrets.key.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(base64.b64encode(AESGCM.generate_key(bit_length=256)).decode())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return base64.b64decode(path.read_text())


class SecretBox:
    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)

    def seal(self, values: Mapping[str, str]) -> str:
        nonce = os.urandom(NONCE_BYTES)
        blob = self._aead.encrypt(nonce, json.dumps(dict(values)).encode(), _AAD)
        return base64.b64encode(nonce + blob).decode()

    def open(self, sealed: str) -> dict[str, str]:
        try:
            raw = base64.b64decode(sealed)
            plain = self._aead.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], _AAD)
        except (InvalidTag, ValueError) as err:
            raise SecretError("sealed env variables could not be opened (fleet key mismatch?)") from err
        values = json.loads(plain)
        if not isinstance(values, dict):
            raise SecretError("sealed env variables are not a mapping")
        return {str(k): str(v) for k, v in values.items()}
