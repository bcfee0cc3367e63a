"""The deployment files for a container engine: the Dockerfile and its build context,
docker compose, and the Prometheus config compose starts.

No container engine runs here, so each file is checked by the real tool that reads it
where one installs from Debian or PyPI (deploy/install_test_tools.sh): docker-compose
renders the compose file and promtool checks the Prometheus config.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from deploy_files import DASHBOARD, DEPLOY, PROMETHEUS_CONFIG, ROOT, SERVER_PORTS, _flag, _tool


try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


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
