"""manifests/install.sh: its options, what it renders, and what it sends to kubectl.

There is no cluster here, so `kubectl` is a recording stand-in on PATH that answers like an empty
cluster (every `get` is "not found") and keeps what it was asked to apply and create. Images are
passed prebuilt (ATE_ENV_IMAGE / ATE_ENV_GUEST_IMAGE), so no container engine is needed either.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.config import parse_config
from common.secret_box import KEY_ENV, load_key

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "manifests" / "install.sh"

FLEET_IMAGE = "registry.example/atefleet@sha256:" + "a" * 64
GUEST_IMAGE = "registry.example/atefleet-guest@sha256:" + "b" * 64
IMAGES = {
    "ATE_ENV_IMAGE": FLEET_IMAGE,
    "ATE_ENV_GUEST_IMAGE": GUEST_IMAGE,
    "ATEOM_IMAGE": "registry.example/ateom@sha256:" + "c" * 64,
    "ATE_ENV_SNAPSHOT_LOCATION": "gs://bucket/atefleet/default-env-template/",
}

FAKE_KUBECTL = """#!{python}
# Records every call; answers like an empty cluster unless FAKE_SECRET_EXISTS is set.
import json, os, pathlib, shutil, sys
out = pathlib.Path(os.environ["FAKE_KUBECTL_DIR"])
args = sys.argv[1:]
calls = out / "calls.jsonl"
n = len(calls.read_text().splitlines()) if calls.exists() else 0
with calls.open("a") as f:
    f.write(json.dumps(args) + "\\n")
if "get" in args:
    sys.exit(0 if os.environ.get("FAKE_SECRET_EXISTS") else 1)
if "apply" in args and args[args.index("-f") + 1] == "-":
    (out / f"apply-{{n:03d}}.yaml").write_text(sys.stdin.read())
if "create" in args:
    for a in args:
        if a.startswith("--from-file="):
            key, path = a[len("--from-file="):].split("=", 1)
            shutil.copy(path, out / f"secret-{{key}}")
"""


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    out: Path

    def calls(self) -> list[list[str]]:
        lines = (self.out / "calls.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    def applied(self) -> list[dict[str, Any]]:
        docs = []
        for path in sorted(self.out.glob("apply-*.yaml")):
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
        return docs

    def secret(self, key: str) -> str:
        return (self.out / f"secret-{key}").read_text()


@pytest.fixture
def run_install(tmp_path: Path) -> Any:
    bindir, out = tmp_path / "bin", tmp_path / "kubectl"
    bindir.mkdir()
    out.mkdir()
    fake = bindir / "kubectl"
    fake.write_text(FAKE_KUBECTL.format(python=sys.executable))
    fake.chmod(0o755)

    def run(*args: str, **env: str) -> Run:
        # A clean environment: no GOOGLE_PROJECT_ID / KUBECTL_CONTEXT from the caller's shell.
        base = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path),
                "FAKE_KUBECTL_DIR": str(out)}
        proc = subprocess.run(["bash", str(INSTALL), *args], env={**base, **env},
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)
        return Run(proc.returncode, proc.stdout, proc.stderr, out)

    return run


def configmap_config_text() -> str:
    docs = yaml.safe_load_all((ROOT / "manifests" / "configmap.yaml").read_text())
    text: str = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["config.yaml"]
    return text


def test_script_is_valid_bash() -> None:
    subprocess.run(["bash", "-n", str(INSTALL)], check=True, timeout=30)
    assert os.access(INSTALL, os.X_OK), "install.sh must be executable"


def test_help_names_both_option_spellings(run_install: Any) -> None:
    run = run_install("--help")
    assert run.returncode == 0
    for flag in ("--deploy", "--delete", "--deploy-ate-env", "--delete-ate-env", "--render"):
        assert re.search(rf"^\s+{flag}\s", run.stdout, re.M), flag


def test_unknown_option_and_no_option_fail(run_install: Any) -> None:
    assert run_install("--bogus").returncode == 1
    assert run_install().returncode == 1


def test_render_fills_every_placeholder(run_install: Any) -> None:
    run = run_install("--render", **IMAGES)
    assert run.returncode == 0, run.stderr
    assert "${" not in run.stdout
    docs = [d for d in yaml.safe_load_all(run.stdout) if d]
    kinds = [d["kind"] for d in docs]
    assert kinds[:3] == ["Namespace", "ServiceAccount", "ConfigMap"]
    assert {"StatefulSet", "ActorTemplate", "WorkerPool"} <= set(kinds)
    images = re.findall(r"image: (\S+)", run.stdout)
    assert set(images) == {FLEET_IMAGE, GUEST_IMAGE, "redis:7"}


def test_render_without_images_fails_clearly(run_install: Any) -> None:
    run = run_install("--render")
    assert run.returncode == 1 and "ATE_ENV_IMAGE" in run.stderr


def test_deploy_creates_a_working_secret_before_the_fleet(run_install: Any) -> None:
    # Given an empty cluster, when deploying with the seed's option name,
    run = run_install("--deploy-ate-env", **IMAGES)
    assert run.returncode == 0, run.stderr
    # then the Secret is generated, and its config part joined to the ConfigMap validates,
    cfg = parse_config(yaml.safe_load(configmap_config_text() + "\n" + run.secret("secrets.yaml")))
    # with the API key printed once (only its hash stored),
    (key,) = re.findall(r"afk_[0-9a-f]{64}", run.stderr)
    assert cfg.auth.api_keys[0].sha256 == hashlib.sha256(key.encode()).hexdigest()
    assert key not in run.secret("secrets.yaml")
    assert cfg.webhooks.secrets["default"].startswith("whsec_")
    # a sealing key the fleet accepts,
    assert len(load_key(run.out, {KEY_ENV: run.secret("secrets-key")})) == 32
    # and the in-cluster Redis URL carries the generated Redis password;
    password = run.secret("redis-password")
    assert re.fullmatch(r"[0-9a-f]{64}", password)
    assert run.secret("redis-url") == f"redis://:{password}@redis.atefleet.svc:6379/0"
    # the namespace comes first and the Secret exists before any Deployment is applied.
    calls = run.calls()
    create = next(i for i, c in enumerate(calls) if "create" in c)
    first_deploy = min(i for i, c in enumerate(calls) if "apply" in c and _applies(run, i, "Deployment"))
    assert create < first_deploy
    applied = run.applied()
    assert applied[0]["kind"] == "Namespace"
    kinds = {d["kind"] for d in applied}
    assert {"StatefulSet", "Deployment", "ActorTemplate", "WorkerPool"} <= kinds
    assert "${" not in json.dumps(applied)
    rollouts = [c for c in calls if "rollout" in c]
    assert len(rollouts) == 5  # redis + api, worker, reconciler, webhooks


def _applies(run: Run, index: int, kind: str) -> bool:
    path = run.out / f"apply-{index:03d}.yaml"
    return path.exists() and any(d and d["kind"] == kind for d in yaml.safe_load_all(path.read_text()))


def test_deploy_keeps_an_existing_secret(run_install: Any) -> None:
    run = run_install("--deploy", FAKE_SECRET_EXISTS="1", **IMAGES)
    assert run.returncode == 0, run.stderr
    assert not any("create" in c for c in run.calls())
    assert "afk_" not in run.stderr


def test_external_redis_skips_the_statefulset(run_install: Any) -> None:
    run = run_install("--deploy", ATE_ENV_EXTERNAL_REDIS_URL="rediss://redis.example:6380/0", **IMAGES)
    assert run.returncode == 0, run.stderr
    assert "StatefulSet" not in {d["kind"] for d in run.applied()}
    assert run.secret("redis-url") == "rediss://redis.example:6380/0"


def test_deploy_without_substrate_values_skips_their_objects_loudly(run_install: Any) -> None:
    run = run_install("--deploy", ATE_ENV_IMAGE=FLEET_IMAGE, ATE_ENV_GUEST_IMAGE=GUEST_IMAGE)
    assert run.returncode == 0, run.stderr
    kinds = {d["kind"] for d in run.applied()}
    assert not kinds & {"ActorTemplate", "WorkerPool"}
    assert "ATE_ENV_SNAPSHOT_LOCATION unset" in run.stderr and "ATEOM_IMAGE unset" in run.stderr


def test_guest_image_must_be_digest_pinned(run_install: Any) -> None:
    tagged = {**IMAGES, "ATE_ENV_GUEST_IMAGE": "registry.example/atefleet-guest:latest"}
    run = run_install("--deploy", **tagged)
    assert run.returncode == 1 and "digest-pinned" in run.stderr


def test_build_needs_a_registry(run_install: Any) -> None:
    run = run_install("--deploy")
    assert run.returncode == 1 and "ATE_ENV_IMAGE_REPO" in run.stderr


def test_delete_removes_namespace_and_substrate_objects(run_install: Any) -> None:
    run = run_install("--delete-ate-env")
    assert run.returncode == 0, run.stderr
    calls = run.calls()
    assert ["delete", "namespace", "atefleet", "--ignore-not-found"] in calls
    deleted_files = [c[-1] for c in calls if c[:3] == ["delete", "--ignore-not-found", "-f"]]
    assert [Path(f).name for f in deleted_files] == ["workerpool.yaml", "actortemplate.yaml"]
