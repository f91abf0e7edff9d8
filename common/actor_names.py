"""Actor names: the one deterministic mapping from a session to its Substrate actor name.

`actor_name(environment, session_id)` is a DNS-1123 label (Substrate rejects anything else) that is

- deterministic and stable: a pure function of its two arguments; it never changes across
  releases (changing it would orphan every existing actor), so the format below is frozen;
- unique across environments and atespaces: Substrate's per-actor lock ignores the atespace, so
  the name itself must not collide. The name ends in a hash of the exact (environment,
  session_id) pair, so two sessions share a name only on a 60-bit hash collision;
- readable: a lowercase slug of the environment and session id, truncated, for humans reading
  `kubectl` output. The slug is decoration; only the hash carries identity.

Format: `s-{slug}-{hash15}` where hash15 = the first 15 hex digits of
sha256("{environment}\\0{session_id}"), and the whole is at most 63 characters.
"""

from __future__ import annotations

import hashlib
import re

#: Maximum length of a DNS-1123 label.
MAX_LABEL = 63
#: Hex digits of the identity hash (60 bits).
HASH_HEX = 15
_NON_LABEL = re.compile(r"[^a-z0-9]+")


def _slug(text: str) -> str:
    return _NON_LABEL.sub("-", text.lower()).strip("-")


def actor_name(environment: str, session_id: str) -> str:
    """The actor name of session `(environment, session_id)`: see the module docstring."""
    digest = hashlib.sha256(f"{environment}\0{session_id}".encode()).hexdigest()[:HASH_HEX]
    room = MAX_LABEL - len("s--") - HASH_HEX
    slug = _slug(f"{environment}-{session_id}")[:room].strip("-")
    return f"s-{slug}-{digest}" if slug else f"s-{digest}"
