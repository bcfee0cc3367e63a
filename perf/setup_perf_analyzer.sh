#!/usr/bin/env bash
# Install NVIDIA perf_analyzer (from the tritonclient 2.51.0 wheel) into perf/.tools/pa-venv.
#
# Idempotent: a second run only checks that the binary still starts.
# Works as root on a fresh Debian machine with Python 3.11 (CI) and as a normal user
# when libb64 is already installed.  No GPU is needed: perf_analyzer only wants
# libcudart.so.12 to be loadable, which the nvidia-cuda-runtime-cu12 wheel provides.
#
# Environment: PYTHON (default python3), PA_TRITONCLIENT_VERSION (default 2.51.0).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TOOLS="$HERE/.tools"
VENV="$TOOLS/pa-venv"
PYTHON="${PYTHON:-python3}"
VERSION="${PA_TRITONCLIENT_VERSION:-2.51.0}"

log() { echo "[setup_perf_analyzer] $*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        log "need root for: $*"; return 1; fi
}

apt_install() {
    # Installs Debian packages only when some are missing.
    local missing=()
    for pkg in "$@"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "apt-get install ${missing[*]}"
    as_root apt-get -o DPkg::Lock::Timeout=600 update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}"
}

# libb64.so.0d is a hard dependency of the perf_analyzer binary.
if ! ldconfig -p 2>/dev/null | grep -q 'libb64\.so\.0d'; then
    apt_install libb64-0d
fi

mkdir -p "$TOOLS"
if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV"
    if ! "$PYTHON" -m venv "$VENV" 2>/dev/null; then
        rm -rf "$VENV"
        apt_install python3-venv
        "$PYTHON" -m venv "$VENV"
    fi
fi

if [ ! -x "$VENV/bin/perf_analyzer" ]; then
    log "installing tritonclient==$VERSION (binary only) and the CUDA runtime wheel"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
        "tritonclient==$VERSION"
fi
if ! ls "$VENV"/lib/python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12 >/dev/null 2>&1; then
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
        "nvidia-cuda-runtime-cu12"
fi

if "$HERE/perf_analyzer" --version >/dev/null 2>&1; then
    log "ok: $("$HERE/perf_analyzer" --version 2>&1 | tail -n1) at $HERE/perf_analyzer"
else
    log "perf_analyzer does not start; missing libraries:"
    LD_LIBRARY_PATH="$(ls -d "$VENV"/lib/python3*/site-packages/nvidia/cuda_runtime/lib)" \
        ldd "$VENV/bin/perf_analyzer" | grep 'not found' >&2 || true
    exit 1
fi
