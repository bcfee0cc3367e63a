"""The Helm chart under deploy/helm/mini-triton, rendered by Helm's own template engine
(the Helm SDK, through helm-python-sdk: deploy/install_test_tools.sh installs it) and
every rendered manifest validated with kubernetes-validate.

No cluster runs here: what is checked is that the chart lints clean, renders with its
defaults and with the values a user changes, that each manifest matches the Kubernetes
schema, and that the pieces fit: probes on the v2 health endpoints of the port the
server listens on, a grace period that covers the drain, a Service and an autoscaler
that find the Deployment, and the autoscaler's metric served by the adapter rule.
"""

from __future__ import annotations

import copy

import pytest
import yaml

from deploy_files import HELM_CHART, SERVER_PORTS, _flag, check_server_arguments

helm = pytest.importorskip(
    "helm_python", reason="helm-python-sdk missing; run deploy/install_test_tools.sh")

RELEASE, NAMESPACE = "example", "inference"
ADAPTER_VALUES = HELM_CHART / "prometheus-adapter-values.yaml"
KUBERNETES_VERSIONS = ("1.27", "latest")

# Values a user sets, each rendered and validated like the defaults.
VALUE_SETS = {
    "defaults": {},
    "no-autoscaling": {"autoscaling": {"enabled": False}, "replicaCount": 3},
    "nfs-repository-and-servicemonitor": {
        "modelRepositoryVolume": {"nfs": {"server": "10.0.0.2", "path": "/srv/models"}},
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    },
    "longer-drain": {"exitTimeoutSecs": 120, "preStopSleepSeconds": 10,
                     "serverArgs": ["--model-repository=/models",
                                    "--model-control-mode=poll"]},
}


def render(values: dict | None = None) -> list[dict]:
    """The chart's manifests as `helm template` gives them, one dict per document."""
    with helm.Chart.load(HELM_CHART) as chart:
        rendered = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE)
    docs = []
    for path, text in sorted(rendered.items()):
        if path.endswith(".yaml"):
            docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == kind]


def the(docs: list[dict], kind: str) -> dict:
    (doc,) = by_kind(docs, kind)
    return doc


def container_of(deployment: dict) -> dict:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def adapter_rule() -> dict:
    (rule,) = yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"]
    return rule


# --- the chart as Helm reads it ------------------------------------------------------


def test_chart_lints_clean():
    for values in VALUE_SETS.values():
        report = helm.lint(HELM_CHART, values, strict=True)
        assert report["errors"] == [], report
        # Severity 2 is a warning, 3 an error; 1 (info) is only "icon is recommended".
        assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


@pytest.mark.parametrize("values, where", [
    ({"exitTimeoutSecs": "30s"}, "/exitTimeoutSecs"),
    ({"autoscaling": {"minReplica": 2}}, "/autoscaling"),
    ({"service": {"httpPort": 70000}}, "/service/httpPort"),
    ({"probes": {"readiness": {"periodSeconds": 0}}}, "/probes/readiness/periodSeconds"),
], ids=["string-timeout", "misspelt-key", "port-range", "zero-period"])
def test_values_schema_refuses_bad_values(values, where):
    """values.schema.json: Helm refuses a bad value before rendering anything."""
    with pytest.raises(helm.HelmValuesError, match=where):
        render(values)


def test_defaults_render_a_deployment_service_and_autoscaler():
    docs = render()
    assert sorted(doc["kind"] for doc in docs) == [
        "Deployment", "HorizontalPodAutoscaler", "Service"]
    for doc in docs:
        assert doc["metadata"]["name"] == f"{RELEASE}-mini-triton"
        assert doc["metadata"]["namespace"] == NAMESPACE


# --- every manifest against the Kubernetes schemas ------------------------------------


def _validate(kv, doc: dict) -> None:
    for version in KUBERNETES_VERSIONS:
        if version == "latest":
            version = kv.utils.latest_version()
        kv.validate(doc, version, strict=True)


def _standard(doc: dict) -> bool:
    """A kind the Kubernetes schemas know (the ServiceMonitor is the Prometheus
    Operator's custom resource: test_service_monitor_scrapes_the_metrics_port)."""
    return not doc["apiVersion"].startswith("monitoring.coreos.com/")


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_rendered_manifests_match_their_schemas(name):
    kv = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate missing; run deploy/install_test_tools.sh")
    docs = render(VALUE_SETS[name])
    assert docs
    for doc in filter(_standard, docs):
        _validate(kv, doc)


def test_schema_validation_catches_a_broken_render():
    kv = pytest.importorskip("kubernetes_validate")
    deployment = the(render(), "Deployment")
    broken = copy.deepcopy(deployment)
    container_of(broken)["startupProbe"]["httpGett"] = container_of(broken)["startupProbe"].pop(
        "httpGet")
    with pytest.raises(kv.ValidationError):
        _validate(kv, broken)


# --- the pieces fit ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_deployment_starts_the_server_with_flags_it_honours(name):
    container = container_of(the(render(VALUE_SETS[name]), "Deployment"))
    assert container["command"] == ["mini-triton"]
    check_server_arguments(f"{HELM_CHART.name} ({name})", container["args"])
    assert _flag(container["args"], "--model-repository") == "/models"


def test_probes_ask_the_v2_health_endpoints_of_the_http_port():
    container = container_of(the(render(), "Deployment"))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert set(ports.values()) == SERVER_PORTS
    # The ports the server listens on (tritonserver's defaults unless the args say).
    assert ports["http"] == int(_flag(container["args"], "--http-port", "8000"))
    assert ports["grpc"] == int(_flag(container["args"], "--grpc-port", "8001"))
    assert ports["metrics"] == int(_flag(container["args"], "--metrics-port", "8002"))
    paths = {kind: container[kind]["httpGet"]["path"]
             for kind in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert paths == {"startupProbe": "/v2/health/ready", "livenessProbe": "/v2/health/live",
                     "readinessProbe": "/v2/health/ready"}
    for kind in paths:
        assert container[kind]["httpGet"]["port"] == "http"


@pytest.mark.parametrize("name", ["defaults", "longer-drain"])
def test_grace_period_covers_the_pre_stop_and_the_drain(name):
    values = VALUE_SETS[name]
    deployment = the(render(values), "Deployment")
    pod, container = deployment["spec"]["template"]["spec"], container_of(deployment)
    exit_timeout = int(_flag(container["args"], "--exit-timeout-secs"))
    assert exit_timeout == values.get("exitTimeoutSecs", 30)
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep", command
    # The grace period runs from the start of preStop; SIGTERM comes after it.
    assert pod["terminationGracePeriodSeconds"] >= int(command[1]) + exit_timeout + 5


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_service_and_autoscaler_find_the_deployment(name):
    docs = render(VALUE_SETS[name])
    deployment = the(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()

    service = the(docs, "Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    assert ports == {"http": (8000, "http"), "grpc": (8001, "grpc"),
                     "metrics": (8002, "metrics")}

    autoscalers = by_kind(docs, "HorizontalPodAutoscaler")
    if not VALUE_SETS[name].get("autoscaling", {}).get("enabled", True):
        assert autoscalers == []
        assert deployment["spec"]["replicas"] == VALUE_SETS[name]["replicaCount"]
        return
    (hpa,) = autoscalers
    assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]


def test_autoscaler_scales_on_the_metric_the_adapter_rule_serves():
    (metric,) = the(render(), "HorizontalPodAutoscaler")["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["target"]["type"] == "AverageValue"
    rule = adapter_rule()
    assert metric["pods"]["metric"]["name"] == rule["name"]["as"] == "avg_time_queue_us"
    # Per pod: the series carry namespace and pod, and the query groups by them.
    assert rule["seriesQuery"].startswith("nv_inference_queue_duration_us{")
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"},
                                             "pod": {"resource": "pod"}}
    assert "<<.LabelMatchers>>" in rule["metricsQuery"]
    assert "<<.GroupBy>>" in rule["metricsQuery"]


def test_service_monitor_scrapes_the_metrics_port():
    docs = render(VALUE_SETS["nfs-repository-and-servicemonitor"])
    monitor = the(docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    service = the(docs, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    deployment = the(docs, "Deployment")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["models"]["nfs"] == {"server": "10.0.0.2", "path": "/srv/models"}
    mounts = {m["name"]: m for m in container_of(deployment)["volumeMounts"]}
    assert mounts["models"] == {"name": "models", "mountPath": "/models", "readOnly": True}
