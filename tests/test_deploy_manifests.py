"""The Kubernetes and KServe manifests, and the server's arguments in every deployment file.

kubernetes-validate checks the Kubernetes manifests against their schemas. KServe's own
kinds have no schema there and get a structural check, with their containers validated
as Kubernetes Containers. Every file that starts the server gives it flags it honours.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from deploy_files import (DEPLOY, HELM_CHART, KSERVE, KUBERNETES, ROOT, SERVER_PORTS,
                          TRITON_METRICS, _flag, check_server_arguments)


try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


KUBERNETES_VERSIONS = ("1.27", "latest")


def _yaml_docs(path: Path) -> list[dict]:
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def _manifests(folder: Path) -> list[tuple[Path, dict]]:
    return [(path, doc) for path in sorted(folder.rglob("*.yaml")) for doc in _yaml_docs(path)]


# --- Kubernetes ------------------------------------------------------------------------


def _kubernetes_validate():
    return pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate missing; run deploy/install_test_tools.sh")


def _validate(kv, doc: dict) -> None:
    for version in KUBERNETES_VERSIONS:
        if version == "latest":
            version = kv.utils.latest_version()
        kv.validate(doc, version, strict=True)


def _validate_container(kv, container: dict) -> None:
    """A container inside a custom resource, checked against core/v1 Container."""
    import jsonschema
    import referencing

    version = kv.utils.latest_version()
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    schema = kv.utils.schema_contents(f"{folder}/container-v1.json", version)
    definitions = kv.utils.schema_contents(f"{folder}/_definitions.json", version)
    registry = referencing.Resource.from_contents(definitions) @ (
        referencing.Resource.from_contents(schema) @ referencing.Registry())
    jsonschema.Draft202012Validator(schema, registry=registry).validate(container)


def _standard(doc: dict) -> bool:
    return not doc["apiVersion"].startswith("serving.kserve.io/")


@pytest.mark.parametrize(
    "path, doc",
    [pytest.param(p, d, id=f"{p.relative_to(DEPLOY)}:{d['kind']}")
     for p, d in _manifests(KUBERNETES) + _manifests(KSERVE) if _standard(d)],
)
def test_kubernetes_manifest_matches_its_schema(path, doc):
    _validate(_kubernetes_validate(), doc)


def test_schema_validation_catches_a_misspelt_field():
    kv = _kubernetes_validate()
    (deployment,) = [d for _, d in _manifests(KUBERNETES) if d["kind"] == "Deployment"]
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {}
    with pytest.raises(kv.ValidationError):
        _validate(kv, broken)
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "45s"
    with pytest.raises(kv.ValidationError):
        _validate(kv, broken)


def _by_kind(folder: Path, kind: str) -> list[dict]:
    return [d for p, d in _manifests(folder) if d["kind"] == kind and "optional" not in p.parts]


def _probe_path(probe: dict) -> str:
    return probe["httpGet"]["path"]


def test_deployment_probes_use_the_v2_health_endpoints():
    (deployment,) = _by_kind(KUBERNETES, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    port_names = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert set(port_names.values()) == SERVER_PORTS
    assert _probe_path(container["readinessProbe"]) == "/v2/health/ready"
    assert _probe_path(container["livenessProbe"]) == "/v2/health/live"
    for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
        if kind in container:
            port = container[kind]["httpGet"]["port"]
            assert port in port_names or port == port_names["http"], (kind, port)
            assert port_names.get(port, port) == int(_flag(container["args"], "--http-port"))


def test_deployment_grace_period_fits_the_exit_timeout():
    (deployment,) = _by_kind(KUBERNETES, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    exit_timeout = int(_flag(container["args"], "--exit-timeout-secs", "30"))
    pre_stop = container["lifecycle"]["preStop"]
    if "sleep" in pre_stop:
        pre_stop_secs = int(pre_stop["sleep"]["seconds"])
    else:
        command = pre_stop["exec"]["command"]
        assert command[0] == "sleep", command
        pre_stop_secs = int(command[1])
    # The grace period runs from the start of preStop; SIGTERM comes after it.
    assert pod["terminationGracePeriodSeconds"] >= pre_stop_secs + exit_timeout + 5


def test_service_hpa_and_pdb_point_at_the_deployment():
    (deployment,) = _by_kind(KUBERNETES, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    port_names = {p["name"] for p in container["ports"]}

    (service,) = _by_kind(KUBERNETES, "Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} == port_names

    hpas = [d for _, d in _manifests(KUBERNETES) if d["kind"] == "HorizontalPodAutoscaler"]
    assert hpas
    for hpa in hpas:
        target = hpa["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
        assert hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
        for metric in hpa["spec"]["metrics"]:
            if metric["type"] == "Resource":
                resource = metric["resource"]["name"]
                assert resource in container["resources"]["requests"], \
                    f"utilization of {resource} needs a request"
            if metric["type"] == "Pods":
                assert metric["pods"]["metric"]["name"] in TRITON_METRICS

    for pdb in _by_kind(KUBERNETES, "PodDisruptionBudget"):
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_images_are_tagged_with_the_package_version():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    (deployment,) = _by_kind(KUBERNETES, "Deployment")
    (runtime,) = _by_kind(KSERVE, "ServingRuntime")
    images = [c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]]
    images += [c["image"] for c in runtime["spec"]["containers"]]
    for image in images:
        assert image == f"mini-triton:{version}", image


# --- KServe (custom resources: structural checks) --------------------------------------


def test_kserve_serving_runtime_speaks_v2_over_http_and_grpc():
    (runtime,) = _by_kind(KSERVE, "ServingRuntime")
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1"
    assert runtime["metadata"]["name"]
    spec = runtime["spec"]
    assert {"v2", "grpc-v2"} <= set(spec["protocolVersions"])
    assert spec["supportedModelFormats"]
    for model_format in spec["supportedModelFormats"]:
        assert isinstance(model_format["name"], str) and model_format["name"]
        assert isinstance(model_format.get("version", ""), str)
        assert isinstance(model_format.get("autoSelect", False), bool)

    (container,) = spec["containers"]
    assert container["name"] == "kserve-container", "KServe finds its container by this name"
    args = container["args"]
    # KServe's storage initializer puts the storageUri contents here.
    assert _flag(args, "--model-store") == "/mnt/models"
    http_port = int(_flag(args, "--http-port"))
    assert http_port == 8080, "KServe routes HTTP to 8080 unless told otherwise"
    assert int(_flag(args, "--grpc-port")) not in {http_port, None}
    metrics_port = _flag(args, "--metrics-port")
    assert spec["annotations"]["prometheus.kserve.io/port"] == metrics_port
    assert spec["annotations"]["prometheus.kserve.io/path"] == "/metrics"

    assert _probe_path(container["readinessProbe"]) == "/v2/health/ready"
    assert _probe_path(container["livenessProbe"]) == "/v2/health/live"
    for kind in ("readinessProbe", "livenessProbe"):
        assert container[kind]["httpGet"]["port"] == http_port

    kv = pytest.importorskip("kubernetes_validate")
    _validate_container(kv, container)


def test_kserve_inference_service_uses_the_runtime():
    (runtime,) = _by_kind(KSERVE, "ServingRuntime")
    (service,) = _by_kind(KSERVE, "InferenceService")
    assert service["apiVersion"] == "serving.kserve.io/v1beta1"
    assert service["metadata"]["name"]
    predictor = service["spec"]["predictor"]
    model = predictor["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    formats = {(f["name"], f.get("version")) for f in runtime["spec"]["supportedModelFormats"]}
    assert (model["modelFormat"]["name"], model["modelFormat"].get("version")) in formats
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    assert re.match(r"^(pvc|s3|gs|https?|hdfs|webhdfs|oci)://", model["storageUri"])
    if model["storageUri"].startswith("pvc://"):
        claim = model["storageUri"][len("pvc://"):].split("/")[0]
        claims = {d["metadata"]["name"] for d in _by_kind(KSERVE, "PersistentVolumeClaim")}
        assert claim in claims
    if "minReplicas" in predictor:
        assert predictor["minReplicas"] <= predictor["maxReplicas"]
    assert predictor.get("scaleMetric", "concurrency") in {"cpu", "memory", "concurrency", "rps"}


# --- the server's arguments in every deployment file ----------------------------------


def _deployment_arguments() -> dict[str, list[str]]:
    """File → the server's arguments, for every file under deploy/ and docker-compose.yml
    that starts the server (the Helm chart's, once rendered: test_deploy_helm.py)."""
    found = {}
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    found["docker-compose.yml"] = compose["services"]["mini-triton"]["command"]
    for path in sorted(DEPLOY.rglob("*.yaml")):
        if path.is_relative_to(HELM_CHART):
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            for container in _containers(doc or {}):
                if str(container.get("image", "")).startswith("mini-triton"):
                    found[str(path.relative_to(ROOT))] = container.get("args", [])
    return found


def _containers(doc: dict) -> list[dict]:
    spec = doc.get("spec") or {}
    pod = ((spec.get("template") or {}).get("spec")) or spec  # Deployment, ServingRuntime
    return list(pod.get("containers") or [])


def test_every_deployment_file_starts_the_server_with_flags_it_honours():
    arguments = _deployment_arguments()
    assert {"docker-compose.yml", "deploy/kubernetes/deployment.yaml",
            "deploy/kserve/servingruntime.yaml"} <= set(arguments)
    for path, args in arguments.items():
        check_server_arguments(path, args)
