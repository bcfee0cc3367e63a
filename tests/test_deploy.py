"""The deployment files: Docker, compose, Prometheus, Grafana, Kubernetes, KServe.

No container engine runs here, so each file is checked by the real tool that
reads it where one installs from Debian or PyPI (deploy/install_test_tools.sh):
docker-compose renders the compose file, promtool checks the Prometheus config
and the dashboard's PromQL, a real Prometheus scrapes a running server and
evaluates every dashboard query, kubernetes-validate checks the Kubernetes
manifests against their schemas. KServe's own kinds have no schema there and
get a structural check, with their containers validated as Kubernetes
Containers.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "mini-triton.json"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
KUBERNETES = DEPLOY / "kubernetes"
KSERVE = DEPLOY / "kserve"
DOCS = ROOT / "docs" / "observability.md"  # where the dashboard panels are explained

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import free_port  # noqa: E402

# Triton's metric families as mini_triton exposes them (summaries only with
# --metrics-config=summary_latencies=true).
TRITON_METRICS = {
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
    "nv_inference_pending_request_count",
    "nv_model_load_duration_secs",
    "nv_cpu_utilization",
    "nv_cpu_memory_total_bytes",
    "nv_cpu_memory_used_bytes",
    "nv_inference_request_summary_us",
    "nv_inference_queue_summary_us",
}
METRIC_NAME = re.compile(r"\bnv_[A-Za-z0-9_]+")
KUBERNETES_VERSIONS = ("1.27", "latest")
SERVER_PORTS = {8000, 8001, 8002}


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"`{name}` is not installed; run deploy/install_test_tools.sh")
    return path


def _yaml_docs(path: Path) -> list[dict]:
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def _manifests(folder: Path) -> list[tuple[Path, dict]]:
    return [(path, doc) for path in sorted(folder.rglob("*.yaml")) for doc in _yaml_docs(path)]


def _flag(args: list[str], name: str, default: str | None = None) -> str | None:
    """The value of a tritonserver-style flag given as --name=value or --name value."""
    for i, arg in enumerate(args):
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
        if arg == name and i + 1 < len(args):
            return args[i + 1]
    return default


def _seconds(value) -> float:
    """Compose durations: '40s', '1m30s', '1.5s' or a number of seconds."""
    if isinstance(value, (int, float)):
        return float(value)
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"([\d.]+)(ms|us|h|m|s)", value)
    assert parts and "".join(n + u for n, u in parts) == value, f"bad duration {value!r}"
    return sum(float(n) * units[u] for n, u in parts)


# --- Dockerfile ----------------------------------------------------------------


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with continuation lines joined."""
    text = (ROOT / "Dockerfile").read_text()
    logical, current = [], ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    pairs = []
    for line in logical:
        keyword, _, rest = line.strip().partition(" ")
        pairs.append((keyword.upper(), rest.strip()))
    return pairs


def _final_stage(instructions):
    starts = [i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM"]
    return instructions[starts[-1]:]


def test_dockerfile_runs_the_server_as_a_non_root_user_on_a_slim_python_base():
    instructions = _dockerfile_instructions()
    args = {rest.split("=", 1)[0]: rest.split("=", 1)[1] for kw, rest in instructions
            if kw == "ARG" and "=" in rest}
    final = _final_stage(instructions)
    base = final[0][1].split()[0]
    base = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), base)
    assert re.fullmatch(r"python:3\.\d+-slim(-\w+)?", base), base

    users = [rest for kw, rest in final if kw == "USER"]
    assert users, "the runtime stage must switch to a non-root USER"
    assert users[-1].split(":")[0] not in {"root", "0"}

    exposed = {int(p.split("/")[0]) for kw, rest in final if kw == "EXPOSE" for p in rest.split()}
    assert exposed == SERVER_PORTS


def test_dockerfile_installs_the_checkout_and_serves_models_from_slash_models():
    instructions = _dockerfile_instructions()
    runs = " ".join(rest for kw, rest in instructions if kw == "RUN")
    assert re.search(r"pip install\s+\"\.\[onnx,pipeline\]\"", runs), runs

    final = _final_stage(instructions)
    cmd = json.loads(next(rest for kw, rest in final if kw == "CMD"))
    assert _flag(cmd, "--model-repository") == "/models"
    assert {int(_flag(cmd, f"--{n}-port")) for n in ("http", "grpc", "metrics")} == SERVER_PORTS


def test_dockerfile_healthcheck_asks_v2_health_ready():
    final = _final_stage(_dockerfile_instructions())
    healthchecks = [rest for kw, rest in final if kw == "HEALTHCHECK"]
    assert len(healthchecks) == 1
    assert "/v2/health/ready" in healthchecks[0]
    assert ":8000/" in healthchecks[0]


def test_dockerfile_sigterm_reaches_the_server():
    """Exec-form ENTRYPOINT: the server is PID 1 itself, not a shell that would
    swallow SIGTERM, so it drains and exits 0 on `docker stop`."""
    final = _final_stage(_dockerfile_instructions())
    entrypoint = next(rest for kw, rest in final if kw == "ENTRYPOINT")
    assert json.loads(entrypoint) == ["mini-triton"]
    stopsignals = [rest for kw, rest in final if kw == "STOPSIGNAL"]
    assert stopsignals in ([], ["SIGTERM"])


def _dockerignore_patterns() -> list[tuple[bool, re.Pattern]]:
    """(negated, regex) per .dockerignore line, in Docker's glob dialect."""
    patterns = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        glob = os.path.normpath(line.lstrip("!").strip().lstrip("/"))
        regex = ""
        for token in re.split(r"(\*\*/|\*\*|\*|\?)", glob):
            regex += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(
                token, re.escape(token))
        patterns.append((negated, re.compile(regex + r"\Z")))
    return patterns


def _in_build_context(relative: str, patterns) -> bool:
    """Docker's rule: the last pattern matching the path or a parent decides."""
    parts = relative.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    included = True
    for negated, pattern in patterns:
        if any(pattern.match(c) for c in candidates):
            included = negated
    return included


def _build_context_files() -> list[str]:
    patterns = _dockerignore_patterns()
    files = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in {".git", ".venv", "node_modules"}]
        for name in filenames:
            relative = os.path.relpath(os.path.join(dirpath, name), ROOT)
            if _in_build_context(relative, patterns):
                files.append(relative)
    return sorted(files)


def test_dockerignore_sends_the_package_and_leaves_out_environments_and_caches():
    patterns = _dockerignore_patterns()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    hatch_wheel = project["tool"]["hatch"]["build"]["targets"]["wheel"]
    needed = ["pyproject.toml", project["project"]["readme"], "model_repository/x/config.pbtxt",
              *(f"{package}/__init__.py" for package in hatch_wheel["packages"]),
              *hatch_wheel.get("force-include", {})]
    for path in needed:
        assert _in_build_context(path, patterns), f"{path} is excluded from the image build"
    for path in [".venv/bin/python", ".git/HEAD", "mini_triton/__pycache__/x.pyc",
                 "tests/test_deploy.py", "perf/results/x.csv", "docs/deploy.md"]:
        assert not _in_build_context(path, patterns), f"{path} would be sent to the build"


def test_docker_build_context_builds_the_wheel(tmp_path):
    """What `pip install ".[onnx,pipeline]"` in the Dockerfile sees is enough to build."""
    pytest.importorskip("hatchling", reason="hatchling missing; run deploy/install_test_tools.sh")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    readme = project["project"]["readme"]
    if not (ROOT / readme).exists():
        pytest.skip(f"{readme} (pyproject's readme) is not in the checkout yet; "
                    "the image build needs it")
    context = tmp_path / "context"
    for relative in _build_context_files():
        target = context / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relative, target)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-q", "-w", str(tmp_path / "dist"), str(context)],
        capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    wheels = list((tmp_path / "dist").glob("mini_triton-*.whl"))
    assert len(wheels) == 1


# --- docker compose ------------------------------------------------------------


def _short_volume(volume) -> tuple[str, str]:
    if isinstance(volume, dict):
        return str(volume.get("source", "")), volume["target"]
    source, target = volume.split(":")[:2]
    return source, target


def _published(port) -> tuple[str, int, int]:
    """(host_ip, published, target) from either compose output format."""
    if isinstance(port, dict):
        return port.get("host_ip", ""), int(port["published"]), int(port["target"])
    spec = port.split("/")[0]
    fields = spec.split(":")
    host_ip = fields[0] if len(fields) == 3 else ""
    return host_ip, int(fields[-2]), int(fields[-1])


@pytest.fixture(scope="module")
def compose_config() -> dict:
    docker_compose = _tool("docker-compose")
    env = {k: v for k, v in os.environ.items()
           if k not in {"BIND_ADDRESS", "GRAFANA_ADMIN_PASSWORD"} and not k.startswith("COMPOSE_")}
    result = subprocess.run(
        [docker_compose, "--file", str(ROOT / "docker-compose.yml"),
         "--project-directory", str(ROOT), "config"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_compose_runs_server_prometheus_and_grafana(compose_config):
    services = compose_config["services"]
    assert {"mini-triton", "prometheus", "grafana"} <= set(services)
    published = {
        name: {_published(p)[1]: _published(p) for p in service.get("ports", [])}
        for name, service in services.items()
    }
    assert set(published["mini-triton"]) == SERVER_PORTS
    assert 9090 in published["prometheus"]
    assert 3000 in published["grafana"]
    for ports in published.values():
        for host_ip, port, target in ports.values():
            assert host_ip == "127.0.0.1", "ports default to localhost only"
            assert port == target


def test_compose_server_mounts_the_repository_and_has_time_to_drain(compose_config):
    server = compose_config["services"]["mini-triton"]
    assert Path(server["build"]["context"]) == ROOT
    command = server["command"]
    assert _flag(command, "--model-repository") == "/models"
    assert "--metrics-config=summary_latencies=true" in command
    volumes = dict(_short_volume(v)[::-1] for v in server["volumes"])
    assert Path(volumes["/models"]) == ROOT / "model_repository"
    assert {int(_flag(command, f"--{n}-port")) for n in ("http", "grpc", "metrics")} == SERVER_PORTS

    exit_timeout = float(_flag(command, "--exit-timeout-secs", "30"))
    assert _seconds(server.get("stop_grace_period", "10s")) > exit_timeout
    assert server.get("stop_signal", "SIGTERM") == "SIGTERM"


def test_compose_prometheus_scrapes_the_server_service(compose_config):
    services = compose_config["services"]
    prometheus = services["prometheus"]
    volumes = {target: Path(source) for source, target in map(_short_volume, prometheus["volumes"])
               if source.startswith("/")}
    config_in_container = _flag(prometheus["command"], "--config.file")
    assert volumes[config_in_container] == PROMETHEUS_CONFIG

    metrics_port = _flag(services["mini-triton"]["command"], "--metrics-port")
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    targets = [t for job in config["scrape_configs"] if job.get("metrics_path", "/metrics") == "/metrics"
               for sc in job.get("static_configs", []) for t in sc["targets"]]
    assert f"mini-triton:{metrics_port}" in targets


def test_compose_grafana_is_provisioned_with_prometheus_and_the_dashboard(compose_config):
    grafana = compose_config["services"]["grafana"]
    mounts = {target: Path(source) for source, target in map(_short_volume, grafana["volumes"])
              if source.startswith("/")}
    provisioning = mounts["/etc/grafana/provisioning"]
    assert provisioning == DEPLOY / "grafana" / "provisioning"

    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus"
    url = urllib.parse.urlsplit(source["url"])
    assert url.hostname in compose_config["services"] and url.port == 9090

    providers = yaml.safe_load((provisioning / "dashboards" / "mini-triton.yml").read_text())
    (provider,) = providers["providers"]
    dashboards_in_container = provider["options"]["path"]
    assert mounts[dashboards_in_container] == DASHBOARD.parent
    assert DASHBOARD.exists()


def test_compose_bind_mounts_exist(compose_config):
    for service in compose_config["services"].values():
        for source, _ in map(_short_volume, service.get("volumes", [])):
            if source.startswith("/"):
                assert Path(source).exists() or Path(source) == ROOT / "model_repository", source


# --- Prometheus config ------------------------------------------------------------


def test_promtool_accepts_the_prometheus_config():
    promtool = _tool("promtool")
    result = subprocess.run([promtool, "check", "config", str(PROMETHEUS_CONFIG)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# --- Grafana dashboard ----------------------------------------------------------------


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _panels(dashboard: dict) -> list[dict]:
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return [p for p in found if p["type"] != "row"]


def _exprs(dashboard: dict) -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in _panels(dashboard)
            for target in panel.get("targets", [])]


def _as_promql(expr: str, window: str = "1m") -> str:
    """A dashboard query with Grafana's variables filled in."""
    for variable in ("__rate_interval", "__interval", "__range"):
        expr = expr.replace(f"${{{variable}}}", window).replace(f"${variable}", window)
    expr = re.sub(r"\$\{?model\}?", ".*", expr)
    assert "$" not in expr, f"unfilled variable in {expr!r}"
    return expr


def _panel_metrics(panel: dict) -> set[str]:
    return {name for target in panel["targets"] for name in METRIC_NAME.findall(target["expr"])}


def test_dashboard_names_only_triton_metrics():
    named = {name for _, expr in _exprs(_dashboard()) for name in METRIC_NAME.findall(expr)}
    assert named, "the dashboard has no nv_* queries"
    assert named <= TRITON_METRICS, named - TRITON_METRICS


def test_dashboard_panels_cover_the_issue():
    panels = _panels(_dashboard())
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in panels}

    def panel_with(predicate) -> str:
        matches = [title for title, expr in exprs.items() if predicate(expr)]
        assert matches, "no panel matches"
        return matches[0]

    panel_with(lambda e: "rate(nv_inference_request_success" in e and "/" not in e)
    panel_with(lambda e: "nv_inference_request_failure" in e and "reason" in e)
    for summary in ("nv_inference_request_summary_us", "nv_inference_queue_summary_us"):
        panel_with(lambda e: summary in e and 'quantile="0.5"' in e and 'quantile="0.99"' in e)
    panel_with(lambda e: re.search(
        r"rate\(nv_inference_request_duration_us.*\)\s*/\s*.*rate\(nv_inference_request_success",
        e, re.S))
    panel_with(lambda e: re.search(
        r"rate\(nv_inference_count.*\)\s*/\s*.*rate\(nv_inference_exec_count", e, re.S))
    panel_with(lambda e: "nv_inference_pending_request_count" in e)
    panel_with(lambda e: "nv_model_load_duration_secs" in e)


def test_dashboard_panels_are_well_formed():
    dashboard = _dashboard()
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"

    every = [p for p in dashboard["panels"]] + [c for p in dashboard["panels"]
                                                  for c in p.get("panels", [])]
    ids = [p["id"] for p in every]
    assert len(ids) == len(set(ids)), "panel ids must be unique"

    occupied = set()
    for panel in every:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        cells = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                 for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not cells & occupied, f"panel {panel['title']!r} overlaps another"
        occupied |= cells

    for panel in _panels(dashboard):
        assert panel.get("description"), f"panel {panel['title']!r} needs a description"
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            assert target["refId"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs))


def test_dashboard_queries_parse_as_promql(tmp_path):
    """promtool parses every panel query (as a recording rule) with the real PromQL parser."""
    promtool = _tool("promtool")
    rules = [{"record": f"dashboard:query_{i}", "expr": _as_promql(expr)}
             for i, (_, expr) in enumerate(_exprs(_dashboard()))]
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_deploy_docs_explain_every_panel():
    if not DOCS.exists():
        pytest.fail(f"{DOCS.relative_to(ROOT)} is missing")
    text = DOCS.read_text()
    for panel in _panels(_dashboard()):
        assert panel["title"] in text, f"README.md does not explain {panel['title']!r}"


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


# --- against a running server ----------------------------------------------------------

IDENTITY_CONFIG = """\
name: "identity_fp32"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { }
"""


def _infer(http_url: str, count: int = 1, fail: bool = False) -> None:
    import numpy as np
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(url=http_url)
    try:
        for _ in range(count):
            data = np.arange(4, dtype=np.float32).reshape(1, 4)
            inputs = [httpclient.InferInput("INPUT0", list(data.shape), "FP32")]
            inputs[0].set_data_from_numpy(data)
            result = client.infer("identity_fp32", inputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
        if fail:
            wrong = np.arange(4, dtype=np.int32).reshape(1, 4)
            inputs = [httpclient.InferInput("INPUT0", list(wrong.shape), "INT32")]
            inputs[0].set_data_from_numpy(wrong)
            with pytest.raises(InferenceServerException):
                client.infer("identity_fp32", inputs)
    finally:
        client.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A server with summary latencies on, after a few inferences and one failure."""
    from serverproc import ServerProcess

    repository = tmp_path_factory.mktemp("repository")
    (repository / "identity_fp32" / "1").mkdir(parents=True)
    (repository / "identity_fp32" / "config.pbtxt").write_text(IDENTITY_CONFIG)
    with ServerProcess(["--model-repository", str(repository),
                        "--metrics-config=summary_latencies=true"]) as server:
        _infer(server.http_url, count=5, fail=True)
        yield server


def _metric_names(exposition: str) -> set[str]:
    names = set()
    for line in exposition.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names


def test_metrics_endpoint_serves_every_metric_the_dashboard_names(served):
    with urllib.request.urlopen(served.metrics_url, timeout=10) as response:
        exposed = _metric_names(response.read().decode())
    for title, expr in _exprs(_dashboard()):
        for name in METRIC_NAME.findall(expr):
            assert name in exposed, f"panel {title!r} queries {name}, absent from /metrics"


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def prometheus(served, tmp_path_factory):
    """A real Prometheus scraping the test server every second; yields its base URL."""
    binary = _tool("prometheus")
    folder = tmp_path_factory.mktemp("prometheus")
    metrics = urllib.parse.urlsplit(served.metrics_url)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{
            "job_name": "mini-triton",
            "metrics_path": metrics.path,
            "static_configs": [{"targets": [metrics.netloc]}],
        }],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (folder / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [binary, f"--config.file={folder / 'prometheus.yml'}",
         f"--storage.tsdb.path={folder / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: _ready(base), 30, proc, folder)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _wait(condition, timeout: float, proc=None, folder=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            pytest.fail("prometheus exited:\n" + (folder / "prometheus.log").read_text())
        value = condition()
        if value:
            return value
        time.sleep(0.25)
    log = (folder / "prometheus.log").read_text() if folder else ""
    pytest.fail(f"timed out after {timeout}s\n{log}")


def _query(base: str, promql: str) -> dict:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        body = _get_json(url)
    except urllib.error.HTTPError as error:
        body = json.loads(error.read())
    assert body["status"] == "success", f"{promql}: {body}"
    return body["data"]


def _values(data: dict) -> list[float]:
    return [float(sample["value"][1]) for sample in data["result"]]


def test_prometheus_scrapes_inference_success_from_the_server(prometheus, served):
    def successes():
        values = _values(_query(prometheus, "nv_inference_request_success"))
        return values if values and max(values) > 0 else None

    values = _wait(successes, 30)
    assert max(values) >= 5


def test_prometheus_evaluates_every_dashboard_query(prometheus, served):
    """Each panel's query runs on real scraped data; all but failures return series."""
    def rate_seen():
        _infer(served.http_url, count=3)
        promql = 'sum(rate(nv_inference_request_success{model="identity_fp32"}[30s]))'
        values = _values(_query(prometheus, promql))
        return values and values[0] > 0

    _wait(rate_seen, 45)
    empty = []
    for title, expr in _exprs(_dashboard()):
        data = _query(prometheus, _as_promql(expr, window="30s"))
        if not data["result"] and "nv_inference_request_failure" not in expr:
            empty.append((title, expr))
    assert not empty, f"queries with no data: {empty}"


# --- the server's arguments in every deployment file ----------------------------------


def _deployment_arguments() -> dict[str, list[str]]:
    """File → the server's arguments, for every file under deploy/ and docker-compose.yml
    that starts the server."""
    found = {}
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    found["docker-compose.yml"] = compose["services"]["mini-triton"]["command"]
    for path in sorted(DEPLOY.rglob("*.yaml")):
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
    from mini_triton.cli import build_parser, settings_from
    from mini_triton.triton_flags import BY_NAME, NOT_HONOURED

    arguments = _deployment_arguments()
    assert {"docker-compose.yml", "deploy/kubernetes/deployment.yaml",
            "deploy/kserve/servingruntime.yaml"} <= set(arguments)
    for path, args in arguments.items():
        settings_from(build_parser().parse_args(args))  # exits on a bad flag or value
        for arg in args:
            name = arg.split("=", 1)[0].removeprefix("--")
            if arg.startswith("--"):
                assert name in BY_NAME, f"{path}: {arg} is not a tritonserver flag"
                assert name not in NOT_HONOURED, f"{path}: {arg} is not honoured here"
