#!/usr/bin/env bash
# Install NVIDIA Triton Model Analyzer 1.46.0 (the release for Triton 2.51) into its own
# venv, perf/.tools/ma-venv: it pins its dependencies, so it never shares a venv with the
# server. Idempotent.
#
# The wheel pulls a perf_analyzer build that needs a newer glibc than Debian 12 has;
# perf/model_analyzer.sh puts the one from perf/setup_perf_analyzer.sh (tritonclient
# 2.51.0) first on PATH instead.
#
# Environment: PYTHON (default python3), MA_VERSION (default 1.46.0).
set -euo pipefail
# -P: the venv's scripts name their interpreter by this path, so it must be the real one
# (perf/.tools may be a link shared by several checkouts).
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
VENV="$(mkdir -p "$HERE/.tools" && cd "$HERE/.tools" && pwd -P)/ma-venv"
PYTHON="${PYTHON:-python3}"
VERSION="${MA_VERSION:-1.46.0}"

mkdir -p "$HERE/.tools"
# A venv whose scripts cannot start (moved, or its interpreter gone) is made again.
if ! "$VENV/bin/model-analyzer" --help > /dev/null 2>&1; then
    rm -rf "$VENV"
    echo "[setup_model_analyzer] installing triton-model-analyzer==$VERSION into $VENV" >&2
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
        "triton-model-analyzer==$VERSION"
fi
if [ ! -x "$HERE/.tools/pa-venv/bin/perf_analyzer" ]; then
    bash "$HERE/setup_perf_analyzer.sh"
fi
"$VENV/bin/model-analyzer" --help > /dev/null
echo "[setup_model_analyzer] ok: $VENV/bin/model-analyzer" >&2
