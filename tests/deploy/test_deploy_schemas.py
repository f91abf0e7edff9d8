"""manifests/ against real schemas, as install.sh renders them.

Kubernetes' own kinds are checked by kubernetes-validate (the JSON schemas of each Kubernetes
release, packaged in the wheel: nothing is fetched) in strict mode, which refuses unknown fields as
`kubectl apply`'s strict field validation does. Substrate's kinds are checked against the facts
written down in substrate_crd_facts.yaml, turned into a JSON Schema here.
"""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
FACTS = yaml.safe_load((Path(__file__).parent / "substrate_crd_facts.yaml").read_text())

#: install.sh's inputs, each already as the cluster needs it (digest-pinned images).
RENDER_ENV = {
    "ATE_ENV_IMAGE": "registry.example/atefleet@sha256:" + "a" * 64,
    "ATE_ENV_GUEST_IMAGE": "registry.example/atefleet-guest@sha256:" + "b" * 64,
    "ATEOM_IMAGE": "registry.example/ateom@sha256:" + "c" * 64,
    "ATE_ENV_SNAPSHOT_LOCATION": "gs://bucket/atefleet/default-env-template/",
}

#: The Kubernetes release the manifests are checked against: the newest the package knows.
KUBERNETES_VERSION = kubernetes_validate.utils.latest_version()

SCALARS = {"string": "string", "integer": "integer", "boolean": "boolean"}


# --- the facts as a JSON Schema ------------------------------------------------------------------


def _field_schema(spec: str) -> tuple[dict[str, Any], bool]:
    """One line of the facts' notation -> (JSON Schema of the field, whether it is required)."""
    kind, *flags = [part.strip() for part in spec.split(",")]
    schema: dict[str, Any]
    if kind in SCALARS:
        schema = {"type": SCALARS[kind]}
    elif kind == "object":
        schema = {"type": "object", "properties": {}, "required": []}
    elif kind == "array":
        schema = {"type": "array"}
    elif kind in ("array of string", "map of string"):
        inner = {"type": "string"}
        schema = ({"type": "array", "items": inner} if kind.startswith("array")
                  else {"type": "object", "additionalProperties": inner})
    else:
        raise ValueError(f"unknown type {kind!r} in {spec!r}")
    required = False
    for flag in flags:
        word, _, arg = flag.partition(" ")
        if word == "required":
            required = True
        elif word == "pinned":
            schema["pattern"] = "@"
        elif word == "enum":
            schema["enum"] = arg.split("|")
        elif word in ("minimum", "maximum", "minLength", "maxItems"):
            schema[word] = int(arg)
        else:
            raise ValueError(f"unknown flag {word!r} in {spec!r}")
    return schema, required


def _parent_and_name(path: str) -> tuple[str, str]:
    if path.endswith("[]"):
        return path[:-2], "[]"
    parent, _, name = path.rpartition(".")
    return parent, name


def schema_from_facts(kind: str) -> dict[str, Any]:
    """A closed JSON Schema of `kind`: each object with listed fields admits only those."""
    facts = FACTS["kinds"][kind]
    root: dict[str, Any] = {
        "type": "object",
        "properties": {
            "apiVersion": {"const": "ate.dev/v1alpha1"},
            "kind": {"const": kind},
            "metadata": {"type": "object", "required": ["name"]},
        },
        "required": ["apiVersion", "kind", "metadata"],
    }
    if facts["scope"] == "Namespaced":
        root["properties"]["metadata"]["required"].append("namespace")
    nodes: dict[str, dict[str, Any]] = {"": root}
    for path, spec in facts["fields"].items():
        schema, required = _field_schema(spec)
        parent_path, name = _parent_and_name(path)
        parent = nodes[parent_path]
        if name == "[]":
            parent["items"] = schema
        else:
            parent.setdefault("properties", {})[name] = schema
            if required:
                parent.setdefault("required", []).append(name)
        nodes[path] = schema
    for node in nodes.values():
        if node.get("type") == "object" and node.get("properties") and node is not root:
            node.setdefault("additionalProperties", False)
    root["additionalProperties"] = False
    return root


def substrate_errors(doc: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema_from_facts(doc["kind"]))
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in validator.iter_errors(doc)]


def kubernetes_errors(doc: dict[str, Any]) -> list[str]:
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{'.'.join(map(str, e.path))}: {e.message}"]
    return []


# --- the manifests as install.sh renders them ----------------------------------------------------


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    env = {"PATH": os.environ["PATH"], **RENDER_ENV}
    proc = subprocess.run(["bash", str(ROOT / "manifests" / "install.sh"), "--render"], env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def _first(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return copy.deepcopy(next(d for d in docs if d["kind"] == kind))


def _is_substrate(doc: dict[str, Any]) -> bool:
    return str(doc["apiVersion"]).startswith("ate.dev/")


def test_every_substrate_object_matches_substrates_crds(rendered: list[dict[str, Any]]) -> None:
    substrate = [d for d in rendered if _is_substrate(d)]
    assert {d["kind"] for d in substrate} == {"ActorTemplate", "WorkerPool"}
    for doc in substrate:
        assert doc["kind"] in FACTS["kinds"], f"no facts written down for {doc['kind']}"
        assert substrate_errors(doc) == [], f"{doc['kind']}/{doc['metadata']['name']}"


def test_every_kubernetes_object_matches_kubernetes_schemas(rendered: list[dict[str, Any]]) -> None:
    kubernetes = [d for d in rendered if not _is_substrate(d)]
    assert len(kubernetes) >= 10
    for doc in kubernetes:
        assert kubernetes_errors(doc) == [], f"{doc['kind']}/{doc['metadata']['name']}"


# --- the checks catch what the API server would refuse -------------------------------------------


def test_an_actor_template_without_a_pause_image_is_refused(rendered: list[dict[str, Any]]) -> None:
    template = _first(rendered, "ActorTemplate")
    del template["spec"]["pauseImage"]
    assert any("'pauseImage' is a required property" in e for e in substrate_errors(template))


@pytest.mark.parametrize("where", ["pauseImage", "containers"])
def test_a_tagged_image_is_refused(rendered: list[dict[str, Any]], where: str) -> None:
    template = _first(rendered, "ActorTemplate")
    if where == "pauseImage":
        template["spec"]["pauseImage"] = "registry.k8s.io/pause:3.10.2"
    else:
        template["spec"]["containers"][0]["image"] = "registry.example/atefleet-guest:latest"
    assert any("does not match '@'" in e for e in substrate_errors(template))


def test_a_field_the_crd_lacks_is_refused(rendered: list[dict[str, Any]]) -> None:
    # Given the field the first manifest had: readyz.timeoutSeconds is not in the CRD
    template = _first(rendered, "ActorTemplate")
    template["spec"]["containers"][0]["readyz"]["timeoutSeconds"] = 60
    # Then it is refused, not silently dropped
    errors = substrate_errors(template)
    assert any("containers.0.readyz" in e and "timeoutSeconds" in e for e in errors), errors


def test_a_worker_pool_without_replicas_is_refused(rendered: list[dict[str, Any]]) -> None:
    pool = _first(rendered, "WorkerPool")
    del pool["spec"]["replicas"]
    assert any("'replicas' is a required property" in e for e in substrate_errors(pool))


def test_kubernetes_validation_refuses_unknown_and_mistyped_fields(rendered: list[dict[str, Any]]) -> None:
    deployment = _first(rendered, "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["timeoutSecond"] = 1
    assert kubernetes_errors(deployment) != []
    deployment = _first(rendered, "Deployment")
    deployment["spec"]["replicas"] = "two"
    assert kubernetes_errors(deployment) != []


def test_install_sh_refuses_a_tagged_pause_image() -> None:
    env = {"PATH": os.environ["PATH"], **RENDER_ENV, "ATE_ENV_PAUSE_IMAGE": "registry.k8s.io/pause:3.10"}
    proc = subprocess.run(["bash", str(ROOT / "manifests" / "install.sh"), "--render"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "ATE_ENV_PAUSE_IMAGE must be digest-pinned" in proc.stderr
