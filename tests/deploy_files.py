"""What the tests of the deployment files share: where the files are, Triton's metric
families, the server's ports, reading a tool's path or a flag's value, and checking
the server's arguments a deployment file gives."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mini_triton.cli import build_parser, settings_from
from mini_triton.cli.triton_flags import BY_NAME, NOT_HONOURED


ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "mini-triton.json"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
KUBERNETES = DEPLOY / "kubernetes"
KSERVE = DEPLOY / "kserve"
HELM_CHART = DEPLOY / "helm" / "mini-triton"  # templates: YAML only once rendered
DOCS = ROOT / "docs" / "observability.md"  # where the dashboard panels are explained


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


SERVER_PORTS = {8000, 8001, 8002}


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"`{name}` is not installed; run deploy/install_test_tools.sh")
    return path


def _flag(args: list[str], name: str, default: str | None = None) -> str | None:
    """The value of a tritonserver-style flag given as --name=value or --name value."""
    for i, arg in enumerate(args):
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
        if arg == name and i + 1 < len(args):
            return args[i + 1]
    return default


def check_server_arguments(where: str, args: list[str]) -> None:
    """`args` parse as the server parses them, and each flag is a tritonserver flag
    honoured here (`where` names the file in the failure)."""
    settings_from(build_parser().parse_args(args))  # exits on a bad flag or value
    for arg in args:
        name = arg.split("=", 1)[0].removeprefix("--")
        if arg.startswith("--"):
            assert name in BY_NAME, f"{where}: {arg} is not a tritonserver flag"
            assert name not in NOT_HONOURED, f"{where}: {arg} is not honoured here"
