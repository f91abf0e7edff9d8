"""The wheel the images install (`pip wheel .` in both Dockerfiles) holds the whole package.

The test suite runs against an editable install, which reads files straight from the checkout; the
images install a built wheel instead, so a Lua script, proto stub or other data file that the
packaging config leaves out would only fail inside a container. This builds the wheel offline from
a copy of the tree and compares it with the package directories.
"""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def package_dirs() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]


def source_files(packages: list[str]) -> set[str]:
    files = set()
    for pkg in packages:
        for path in (ROOT / pkg).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                files.add(path.relative_to(ROOT).as_posix())
    return files


def build_wheel(tmp_path: Path, packages: list[str]) -> Path:
    src, out = tmp_path / "src", tmp_path / "wheel"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for pkg in packages:
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # Offline: the virtualenv's setuptools builds it, as pip does in the image's build stage.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-q", "-w", str(out), str(src)],
        check=True, capture_output=True, timeout=180,
    )
    (wheel,) = out.glob("atefleet-*.whl")
    return wheel


def test_wheel_holds_every_package_file_and_the_console_script(tmp_path: Path) -> None:
    packages = package_dirs()
    wheel = build_wheel(tmp_path, packages)
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = configparser.ConfigParser()
        scripts.read_string(zf.read(entry_points).decode())
    missing = sorted(source_files(packages) - names)
    assert not missing, f"the wheel (and so the images) would lack {missing}"
    assert scripts["console_scripts"]["atefleet"] == "atefleet.cli:main"
