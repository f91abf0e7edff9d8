"""The SDK installs and works on its own: `pip install ./sdk` into a fresh venv (Debian 12's
/usr/bin/python3 when present), no server package, then sync and async calls to the real fleet."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from tests.client.conftest import RunningFleet

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import asyncio, sys
from atefleet.client import AsyncClient, Client
url, sid = sys.argv[1], sys.argv[2]
with Client(url) as client:
    session = client.session("my-env", sid, auto_resume=True)
    print(session.bash("echo sync").output, end="")
async def main():
    async with AsyncClient(url) as client:
        print((await client.session("my-env", sid, auto_resume=True).bash("echo async")).output, end="")
asyncio.run(main())
try:
    import api  # the server's packages must not be there
    print("server code importable")
except ImportError:
    pass
"""


def test_sdk_distribution_alone(fleet: RunningFleet, tmp_path: Path) -> None:
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    # Given the distribution copied out of the repo (its link to atefleet/client resolved)
    source = tmp_path / "sdk"
    shutil.copytree(REPO / "sdk", source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(source)], check=True, timeout=600)
    installed = subprocess.run([str(venv / "bin" / "pip"), "list", "--format=freeze"], check=True,
                               capture_output=True, text=True).stdout
    assert "fastapi" not in installed and "redis" not in installed
    # When a script uses it from outside the repo
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ATEFLEET_TOKEN")}
    sid = f"inst-{uuid.uuid4().hex[:8]}"
    done = subprocess.run([str(venv / "bin" / "python"), "-c", SCRIPT, fleet.url, sid], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    # Then both clients work, and nothing of the server came along
    assert done.returncode == 0, done.stderr
    assert done.stdout == "sync\nasync\n"  # not "server code importable"
