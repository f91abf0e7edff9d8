"""What a guest's start imports: every cold resume pays for it, in CPU and in the memory each
running or frozen sandbox holds. OpenSSL stays out (asyncio would import ssl, and secrets or
hashlib load libcrypto): the guest speaks plain HTTP on a unix socket and needs no hash to start.
"""

from __future__ import annotations

import subprocess
import sysconfig
from pathlib import Path

import guest
from local_substrate.guests import GUEST_BOOT, PYTHON_FLAGS
from local_substrate.sandbox import python_executable

#: Modules that load OpenSSL's libraries into the process, or import one that does. (`ssl`
#: itself shows as tried: GUEST_BOOT makes it unimportable, so asyncio goes on without it.)
OPENSSL = {"_ssl", "hashlib", "_hashlib", "hmac", "secrets"}
#: Imported where first needed instead: the first query string (an execution's poll).
LATER = {"urllib.parse"}


def started_modules() -> set[str]:
    """The modules the production command line imports before the guest parses its arguments
    (`--help` stops it there, after every module-level import of guest/ and its tools)."""
    code_root = str(Path(guest.__file__ or "").parent.parent)
    boot = GUEST_BOOT.format(path=[code_root, sysconfig.get_path("purelib")])
    done = subprocess.run(
        [python_executable(), *PYTHON_FLAGS, "-X", "importtime", "-c", boot, "--help"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "--actor" in done.stdout
    lines = done.stderr.splitlines()
    return {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")}


def test_a_guest_start_loads_no_openssl_and_defers_the_query_parser() -> None:
    modules = started_modules()
    assert "guest.tools.write_file" in modules and "guest.server" in modules
    assert not modules & OPENSSL, sorted(modules & OPENSSL)
    assert not modules & LATER, sorted(modules & LATER)
