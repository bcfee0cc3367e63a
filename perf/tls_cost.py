#!/usr/bin/env python3
"""What TLS costs per request: the same tree served twice, plaintext and TLS, measured
alternately in one run with perf_analyzer (HTTP and gRPC, chosen concurrencies), with
the server's CPU time per request (its worker processes included) beside throughput.

    python perf/tls_cost.py                        # http/grpc at c1 and c16, 2 repetitions
    python perf/tls_cost.py --points grpc:1 --reps 3 --shape INPUT0:150528

Certificates are made for the run (tests/test_tls.py's make_pki). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))
from measurements import inference_count, process_tree_cpu  # noqa: E402
from serverproc import ServerProcess  # noqa: E402
from test_tls import make_pki  # noqa: E402

PERF_ANALYZER = HERE / "perf_analyzer"


def tls_flags(pki: dict) -> list[str]:
    files = [f"--{p}-server-cert={pki['server_cert']}" for p in ("grpc", "http")]
    files += [f"--{p}-server-key={pki['server_key']}" for p in ("grpc", "http")]
    return ["--grpc-use-ssl=true", "--http-use-ssl=true", *files]


def client_flags(protocol: str, pki: dict | None) -> list[str]:
    if pki is None:
        return []
    if protocol == "grpc":
        return ["--ssl-grpc-use-ssl", f"--ssl-grpc-root-certifications-file={pki['ca']}"]
    return [f"--ssl-https-ca-certificates-file={pki['ca']}", "--ssl-https-verify-peer=1",
            "--ssl-https-verify-host=2"]


def server_cpu(server: ServerProcess) -> float:
    """CPU seconds of the server and its worker processes so far."""
    return process_tree_cpu(server.proc.pid)


def measure(server: ServerProcess, protocol: str, concurrency: int, pki, args) -> tuple:
    port = server.ports["grpc" if protocol == "grpc" else "http"]
    host = "localhost" if pki is not None else "127.0.0.1"
    url = f"https://{host}:{port}" if pki is not None and protocol == "http" else f"{host}:{port}"
    command = [str(PERF_ANALYZER), "-m", args.model, "-u", url, "-i", protocol,
               "--concurrency-range", str(concurrency), "-p", "2000", "-s", "50", "-r", "10",
               "--shape", args.shape, *client_flags(protocol, pki)]
    cpu_before, served_before = server_cpu(server), served(server, pki, args.model)
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    cpu = server_cpu(server) - cpu_before
    requests = served(server, pki, args.model) - served_before
    throughput = 0.0
    for line in done.stdout.splitlines():
        if line.startswith("Concurrency:"):
            throughput = float(line.split("throughput:")[1].split()[0])
    if not throughput:
        raise RuntimeError(f"perf_analyzer gave no result:\n{done.stdout}\n{done.stderr}")
    return throughput, cpu / max(1, requests) * 1e6


def wait_ready_over_tls(server: ServerProcess, pki, timeout: float = 60) -> None:
    context = ssl.create_default_context(cafile=str(pki["ca"]))
    url = f"https://localhost:{server.ports['http']}/v2/health/ready"
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5, context=context):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def served(server: ServerProcess, pki, model: str) -> int:
    """Requests the server has answered for `model` (its statistics API): every
    request of a run, warm-up included, as the CPU time counts them all."""
    scheme, context = ("https", ssl.create_default_context(cafile=str(pki["ca"]))) \
        if pki is not None else ("http", None)
    return inference_count(f"{scheme}://localhost:{server.ports['http']}", model, context)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", nargs="+", default=["http:1", "http:16", "grpc:1",
                                                        "grpc:16"])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--repository", default=str(HERE / "repos" / "python_identity"))
    parser.add_argument("--model", default="identity_py")
    parser.add_argument("--shape", default="INPUT0:16")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        pki = make_pki(Path(folder))
        base = [f"--model-repository={args.repository}", "--http-address=127.0.0.1",
                "--grpc-address=127.0.0.1"]
        plain = ServerProcess(base, expect_ready=True).start()
        secure = ServerProcess(base + tls_flags(pki), expect_ready=False).start()
        try:
            wait_ready_over_tls(secure, pki)
            print(f"| rep | point | plaintext infer/s | TLS infer/s | TLS / plaintext "
                  f"| plaintext CPU us/req | TLS CPU us/req |  ({args.shape})")
            print("|---|---|---|---|---|---|---|")
            for rep in range(1, args.reps + 1):
                for point in args.points:
                    protocol, concurrency = point.split(":")
                    order = [(plain, None), (secure, pki)]
                    if rep % 2 == 0:
                        order.reverse()
                    results = {id(s): measure(s, protocol, int(concurrency), p, args)
                               for s, p in order}
                    (pt, pc), (st, sc) = results[id(plain)], results[id(secure)]
                    print(f"| {rep} | {point} | {pt:,.0f} | {st:,.0f} | {st / pt:.2f}x "
                          f"| {pc:.0f} | {sc:.0f} |", flush=True)
        finally:
            plain.stop()
            secure.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
