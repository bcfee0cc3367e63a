#!/usr/bin/env bash
# Install what tests/test_deploy_*.py run for real: docker-compose (to render
# and check docker-compose.yml), Prometheus and promtool (to check the config
# and to scrape a live server), kubernetes-validate (Kubernetes schemas),
# helm-python-sdk (Helm's own SDK as a library, to lint and render the chart
# under deploy/helm: the package registries this project installs from have
# no helm binary, nor the Go modules to build one) and hatchling (to build the wheel
# from the Docker build context); and the
# independent HTTP/2 stacks the interop tests drive: h2load (nghttp2-client)
# and Node with @grpc/grpc-js (npm ci in tests/interop, versions from its
# package-lock.json).
#
# Debian, as root; safe to run again. No container engine is installed or
# started: docker-compose only renders the file here.
#
#   sudo deploy/install_test_tools.sh [PYTHON]
#
# PYTHON is the interpreter of the environment the tests run in
# (default: .venv/bin/python if present, else python3).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${1:-}"
if [[ -z "${python}" ]]; then
    if [[ -x "${here}/.venv/bin/python" ]]; then
        python="${here}/.venv/bin/python"
    else
        python="python3"
    fi
fi

missing=()
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
    missing+=(prometheus)
fi
command -v h2load >/dev/null 2>&1 || missing+=(nghttp2-client)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

if ((${#missing[@]})); then
    if [[ "$(id -u)" != 0 ]]; then
        echo "install_test_tools: need root to apt-get install ${missing[*]}" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # --no-install-recommends: docker-compose recommends the docker engine,
    # which the tests neither need nor start.
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Debian package enables a prometheus service; the tests start their own
# on a free port, so stop a packaged one if an init system started it.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
    systemctl disable --now prometheus >/dev/null 2>&1 || true
fi

"${python}" -m pip install -q --disable-pip-version-check \
    "kubernetes-validate>=1.28" "hatchling>=1.21" "helm-python-sdk==0.2.2"

# Exactly the locked versions; no install scripts (none of these packages needs one).
(cd "${here}/tests/interop" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)

docker-compose version --short
promtool --version 2>&1 | head -n 1
prometheus --version 2>&1 | head -n 1
h2load --version
echo "node $(node --version)"
(cd "${here}/tests/interop" \
    && node -e "console.log('@grpc/grpc-js', require('@grpc/grpc-js/package.json').version)")
"${python}" -c "import hatchling; from kubernetes_validate.version import __version__ as v; print('kubernetes-validate', v)"
"${python}" -c "import helm_python as h; print('helm-python-sdk', h.helm_c_version(), 'Helm SDK', h.helm_sdk_version())"
