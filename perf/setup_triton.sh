#!/usr/bin/env bash
# Install the real NVIDIA Triton 2.51 server (CPU, Python backend only) as a baseline.
#
# The nvidia-pytriton 0.5.14 wheel bundles tritonserver 2.51 with its shared libraries and
# the Python backend.  This script puts it in perf/.tools/triton-venv, lays out a backend
# directory at perf/.tools/backends/python/ (libtriton_python.so, the backend utils and the
# stub for this Python) and leaves perf/tritonserver as the way to run it.
#
# Idempotent; works as root on a fresh Debian machine with Python 3.11.
# Environment: PYTHON (default python3), PYTRITON_VERSION (default 0.5.14).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TOOLS="$HERE/.tools"
VENV="$TOOLS/triton-venv"
BACKENDS="$TOOLS/backends"
PYTHON="${PYTHON:-python3}"
VERSION="${PYTRITON_VERSION:-0.5.14}"

log() { echo "[setup_triton] $*" >&2; }

mkdir -p "$TOOLS"
if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV"
    if ! "$PYTHON" -m venv "$VENV" 2>/dev/null; then
        rm -rf "$VENV"
        if [ "$(id -u)" -eq 0 ]; then
            apt-get -o DPkg::Lock::Timeout=600 update -qq
            DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq python3-venv
        fi
        "$PYTHON" -m venv "$VENV"
    fi
fi

SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
PYVER="$("$VENV/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
TS="$SITE/pytriton/tritonserver"

if [ ! -x "$TS/bin/tritonserver" ]; then
    log "installing nvidia-pytriton==$VERSION (bundles tritonserver 2.51)"
    # Its dependencies bring numpy, which the Python backend stub imports.
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "nvidia-pytriton==$VERSION"
fi

STUB="$TS/python_backend_stubs/$PYVER/triton_python_backend_stub"
if [ ! -x "$STUB" ]; then
    log "no Python backend stub for Python $PYVER in nvidia-pytriton $VERSION"
    exit 1
fi
# The stub embeds the system's libpython (Debian's libpython3.11 package).
if LD_LIBRARY_PATH="$SITE/nvidia_pytriton.libs" ldd "$STUB" | grep -q 'libpython.*not found'; then
    if [ "$(id -u)" -eq 0 ]; then
        log "apt-get install libpython$PYVER"
        apt-get -o DPkg::Lock::Timeout=600 update -qq
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "libpython$PYVER"
    else
        log "the Python backend stub needs libpython$PYVER (apt-get install libpython$PYVER)"
    fi
fi
# The backend looks for its stub next to libtriton_python.so; copy rather than link so
# that its own path resolution cannot lead back into the wheel's directory.
mkdir -p "$BACKENDS/python"
for f in "$TS/backends/python/libtriton_python.so" \
         "$TS/backends/python/triton_python_backend_utils.py" "$STUB"; do
    cmp -s "$f" "$BACKENDS/python/$(basename "$f")" || cp -f "$f" "$BACKENDS/python/"
done

# tritonserver --help exits 1, so look for its usage text instead of the exit status.
if { "$HERE/tritonserver" --help 2>&1 || true; } | grep -q "Usage: tritonserver"; then
    log "ok: $HERE/tritonserver (backends in $BACKENDS)"
else
    log "tritonserver does not start; missing libraries:"
    LD_LIBRARY_PATH="$SITE/nvidia_pytriton.libs" ldd "$TS/bin/tritonserver" | grep 'not found' >&2 || true
    exit 1
fi
