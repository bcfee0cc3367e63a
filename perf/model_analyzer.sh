#!/usr/bin/env bash
# NVIDIA Model Analyzer end to end against our server, as a Triton user runs it:
# `model-analyzer profile --triton-launch-mode=local --triton-server-path=<our entry point>`
# starts and stops the server itself (--model-control-mode=explicit, its own flags), loads
# each config variant it writes into its output repository, drives perf_analyzer, scrapes
# /metrics; then `model-analyzer report` writes the detailed reports.
#
#   bash perf/model_analyzer.sh        # results under perf/results/model-analyzer/
#
# Profiles a Python model (postprocess) and an ONNX model (classifier) of
# model_repository/ with cpu_only: true, sweeping instance count (1, 2) and the dynamic
# batcher's queue delay (0, 1000 us) at concurrency CONCURRENCY (default "4"); about
# 6-10 minutes on 2 busy cores. Prints the summary as a Markdown table (perf/README.md).
# Environment: PYTHON (the server's interpreter, default .venv/bin/python of the checkout,
# else /work/main's), CONCURRENCY.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
TOOLS="$HERE/.tools"
OUT="$HERE/results/model-analyzer"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=/work/main/.venv/bin/python

bash "$HERE/setup_model_analyzer.sh"
# Our entry point, as a Helm chart would name it; PYTHONPATH makes it run this checkout.
SERVER="$(dirname "$PY")/mini-triton"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# perf_analyzer 2.51 from setup_perf_analyzer.sh first (the one the wheel pulls needs a
# newer glibc), and the CUDA runtime library it loads.
export PATH="$TOOLS/pa-venv/bin:$TOOLS/ma-venv/bin:$PATH"
CUDART="$(ls -d "$TOOLS"/pa-venv/lib/python3*/site-packages/nvidia/cuda_runtime/lib | head -n1)"
export LD_LIBRARY_PATH="$CUDART${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

rm -rf "$OUT" && mkdir -p "$OUT"
sweep() {  # the per-model part of the config: CPU only, the sweep, the load
    cat <<YAML
  $1:
    cpu_only: true
    model_config_parameters:
      instance_group:
        - kind: KIND_CPU
          count: [1, 2]
      dynamic_batching:
        max_queue_delay_microseconds: [0, 1000]
    parameters:
      concurrency: [$(echo "${CONCURRENCY:-4}" | sed 's/ /, /g')]
      batch_sizes: [1]
YAML
}
cat > "$OUT/config.yaml" <<YAML
model_repository: $ROOT/model_repository
output_model_repository_path: $OUT/output_repository
override_output_model_repository: true
export_path: $OUT
checkpoint_directory: $OUT/checkpoints
triton_launch_mode: local
triton_server_path: $SERVER
triton_output_path: $OUT/server.log
collect_cpu_metrics: true
run_config_search_disable: true
# Its gRPC client, created before each server start, meets the refused connection and
# then waits out gRPC's reconnect backoff (15-20 s per configuration measured here, with
# our native transport and with grpcio's alike); the HTTP client asks again at once.
client_protocol: http
# Two runs here differ by 15-25% (shared cores): perf_analyzer's default 10% stability
# would have Model Analyzer retry each measurement with ever larger windows.
perf_analyzer_flags:
  measurement-mode: count_windows
  measurement-request-count: 100
  stability-percentage: 25
profile_models:
$(sweep postprocess)
$(sweep classifier)
YAML

cd "$OUT"
model-analyzer profile -f "$OUT/config.yaml" 2>&1 | tee "$OUT/profile.txt"
for model in postprocess classifier; do  # one model per report, as Model Analyzer wants
    model-analyzer report --report-model-configs "${model}_config_default" -e "$OUT" \
        --checkpoint-directory "$OUT/checkpoints" 2>&1 | tee -a "$OUT/report.txt"
done

# The summary as a Markdown table: each variant's instances and queue delay read back
# from the config Model Analyzer wrote.
"$PY" - "$OUT" <<'PYTHON'
import csv, re, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = list(csv.DictReader(open(out / "results" / "metrics-model-inference.csv")))
print("| model | config | instances | queue delay (us) | concurrency | infer/s | p99 latency (ms) |")
print("|---|---|---|---|---|---|---|")
for row in sorted(rows, key=lambda r: (r["Model"], -float(r["Throughput (infer/sec)"]))):
    config = (out / "output_repository" / row["Model Config Path"] / "config.pbtxt").read_text()
    delay = re.search(r"max_queue_delay_microseconds:\s*(\d+)", config)
    # A delay of 0 is the proto default, which the written config leaves out.
    delay = delay.group(1) if delay else "0" if "dynamic_batching" in config else "no batcher"
    print(f"| {row['Model']} | {row['Model Config Path']} | {row['Instance Group']} | "
          f"{delay} | {row['Concurrency']} | {row['Throughput (infer/sec)']} | "
          f"{row['p99 Latency (ms)']} |")
PYTHON
ls "$OUT"/reports/summaries/*/result_summary.* "$OUT"/reports/detailed/*/detailed_report.*
