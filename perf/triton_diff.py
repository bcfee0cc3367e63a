#!/usr/bin/env python3
"""Start mini_triton and the real Triton 2.51 side by side on one repository of Python models
(perf/repos/fidelity: echo with batching, a decoupled generator, an ensemble of two Python
steps, a sequence model), ask both the same things with stock tritonclient and raw HTTP,
and print every place where the answers differ.

    perf/setup_triton.sh                # once: installs Triton 2.51 in perf/.tools
    python perf/triton_diff.py          # prints the differences and a summary
    python perf/triton_diff.py -k metrics -k generate   # only probes whose name has a word

What is compared: server and model metadata, model config (HTTP JSON and gRPC), repository
index, statistics (fields and order), the /metrics page (families, HELP/TYPE, labels,
order), inference answers (ensembles: output order, parameters), error status codes and
texts for common client mistakes on both protocols, the generate extension, the
messages of the start-up log, and the shape of the trace files each server writes for the
same requests (perf/triton_diff_traces.py). Values that change from run to run (times,
durations, ports) are replaced before comparing (perf/triton_diff_probes.py says which).
Differences that are on purpose are listed in docs/migrating-from-triton.md; this script
shows them too.
Exit status: 0 when every difference is on purpose or known (ON_PURPOSE, KNOWN_OPEN), 1
when one is not, 2 when a server did not start. Log messages are listed, not counted.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import Server, free_port  # noqa: E402
from measurements import PERF_DIR  # noqa: E402
from triton_diff_probes import Target, probes  # noqa: E402
from triton_diff_traces import trace_probes  # noqa: E402

REPOSITORY = PERF_DIR / "repos" / "fidelity"

# Differences kept on purpose, each a row of docs/migrating-from-triton.md's table.
ON_PURPOSE = {
    "http err malformed json": "a body that is not JSON is 400, not 500",
    "generate malformed json": "a body that is not JSON is 400, not 500",
    "generate on decoupled": "/generate on a model with other than one response is 500, not 200",
    "http infer pipeline one output": "an ensemble asked for some outputs is served "
                                      "(Triton: 'unexpected deadlock')",
    "http err log level not a number": "a logging setting of the wrong JSON type is 400",
    "http err index ready not a boolean": "a repository index 'ready' that is not a boolean "
                                          "is 400",
    "generate parameters not an object": "a generate request of the wrong JSON type is 400",
    "generate id not a string": "a generate request of the wrong JSON type is 400",
    "tritonclient http shm register bad key": "a key that cannot be opened is 400, and the "
                                              "message says why after Triton's words",
    "tritonclient grpc shm register bad key": "as over HTTP, INVALID_ARGUMENT",
    "http infer answer_twice": "a second response of a model that is not decoupled is 500 "
                               "'expected a single response, got 2' (Triton writes both "
                               "into one body tritonclient cannot read)",
}
# Differences seen and not resolved yet (say why, and where they belong).
KNOWN_OPEN: dict[str, str] = {}
# Error and empty replies: Triton says text/plain for a JSON body; we say application/json
# (on purpose): compared as equal.
_CONTENT_TYPES_ALIKE = {"text/plain", "application/json"}
MODELS = ("echo", "gen", "gen_stream", "pipeline", "seq", "step_a", "step_b", "warm",
          "answer_late", "answer_twice", "stream_after")


def start(name: str, python: str, out_dir: Path) -> Server:
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    flags = ["--model-repository", str(REPOSITORY), "--http-port", str(ports["http"]),
             "--grpc-port", str(ports["grpc"]), "--metrics-port", str(ports["metrics"]),
             # Tracing stays off until a trace probe turns it on for a model; each trace
             # then goes to a file of its own (triton_diff_traces).
             "--trace-config", f"triton,file={trace_file_of(name, out_dir)}",
             "--trace-config", "triton,log-frequency=1"]
    command = ([str(PERF_DIR / "tritonserver"), *flags] if name == "triton"
               else [python, "-m", "mini_triton", *flags])
    server = Server(name, command, out_dir / f"{name}.log", ports)
    server.start()
    return server


def trace_file_of(name: str, out_dir: Path) -> str:
    return str(out_dir / f"{name}.trace.json")


def target_of(server: Server) -> Target:
    return Target(http=server.http_url, grpc=server.grpc_url,
                  metrics=f"127.0.0.1:{server.ports['metrics']}",
                  trace_file=trace_file_of(server.name, server.log_path.parent))


def run_probes(servers: dict[str, Server], words: list[str]) -> list[tuple[str, list[str]]]:
    """(probe name, diff lines) for every probe that differs, in the order they ran."""
    differences = []
    targets = {name: target_of(server) for name, server in servers.items()}
    for name, probe in probes() + trace_probes():
        if words and not any(word in name for word in words):
            continue
        answers = {}
        for server_name, target in targets.items():
            try:
                answers[server_name] = probe(target)
            except Exception as error:  # a probe that breaks is itself a difference
                answers[server_name] = f"probe raised {type(error).__name__}: {error}"
        diff = diff_lines(*(_content_type_alike(answers[s]) for s in ("triton", "mini_triton")))
        if diff:
            differences.append((name, diff))
    return differences


def _content_type_alike(answer):
    if isinstance(answer, dict) and answer.get("headers", {}).get("Content-Type") in \
            _CONTENT_TYPES_ALIKE:
        return {**answer, "headers": {**answer["headers"], "Content-Type": "<json or text>"}}
    return answer


def diff_lines(theirs, ours) -> list[str]:
    def lines(value):
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return value
        return json.dumps(value, indent=1, ensure_ascii=False).splitlines()
    if theirs == ours:
        return []
    return list(difflib.unified_diff(lines(theirs), lines(ours), "triton", "mini_triton",
                                     lineterm="", n=2))


LOG_LINE = re.compile(r'^([IWEV])\d{4} [\d:.]+ +\d+ [^\]]+\] (.*)$')
# Log lines about GPUs, CUDA and DCGM, which a CPU-only Triton writes and we have no cause to.
_GPU_WORDS = re.compile(r"CUDA|DCGM|pinned|CudaDriverHelper|NVML")


def log_messages(path: Path) -> set[str]:
    """Severity and text of each start-up log line, numbers and paths made neutral."""
    messages = set()
    for line in path.read_text(errors="replace").splitlines():
        match = LOG_LINE.match(line)
        if match and not _GPU_WORDS.search(match.group(2)):
            text = re.sub(r"\d+", "N", match.group(2))
            messages.add(f"{match.group(1)} {text.strip()}")
    return messages


# Our own lines, on purpose: the project's name and version where a person looks, and
# the last line of a clean exit.
OUR_OWN_LOG_LINES = {'I "mini_triton N.N.N (serves the API of Triton N.N.N)"',
                     'I "Server stopped"'}


def log_differences(servers: dict[str, Server]) -> list[str]:
    time.sleep(1.0)  # the output pumps may still be writing the last lines
    theirs = log_messages(servers["triton"].log_path)
    ours = log_messages(servers["mini_triton"].log_path) - OUR_OWN_LOG_LINES
    return ([f"- {line}" for line in sorted(theirs - ours)] +
            [f"+ {line}" for line in sorted(ours - theirs)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", action="append", default=[], dest="words",
                        help="only probes whose name contains this (repeatable)")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter that runs mini_triton (default: this one)")
    parser.add_argument("--timeout", type=float, default=180,
                        help="seconds each server may take to get ready")
    args = parser.parse_args(argv)
    out_dir = Path(tempfile.mkdtemp(prefix="triton_diff_"))
    servers = {name: start(name, args.python, out_dir) for name in ("triton", "mini_triton")}
    try:
        for server in servers.values():
            for model in MODELS:
                server.wait_ready(model, args.timeout)
    except RuntimeError as error:
        print(error)
        for server in servers.values():
            server.stop()
        return 2
    try:
        differences = run_probes(servers, args.words)
    finally:
        for server in servers.values():
            server.stop()
    return report(differences, log_differences(servers) if not args.words else [], out_dir)


def report(differences, log_lines, out_dir: Path) -> int:
    """Print every difference, then a summary by kind; 1 when one is not accounted for."""
    for name, diff in differences:
        print(f"=== {name}")
        print("\n".join(diff[2:]))
    if log_lines:
        print("=== start-up log messages (- only Triton, + only mini_triton)")
        print("\n".join(log_lines))
    unexpected = [n for n, _ in differences if n not in ON_PURPOSE and n not in KNOWN_OPEN]
    print(f"\nsummary: {len(differences)} of the probes differ: {len(unexpected)} unexpected, "
          f"{sum(n in KNOWN_OPEN for n, _ in differences)} known and open, "
          f"{sum(n in ON_PURPOSE for n, _ in differences)} on purpose"
          + (f"; {len(log_lines)} log messages differ" if log_lines else ""))
    for name, _ in differences:
        why = ON_PURPOSE.get(name) or KNOWN_OPEN.get(name)
        kind = "on purpose" if name in ON_PURPOSE else "open" if name in KNOWN_OPEN \
            else "UNEXPECTED"
        print(f"  {kind}: {name}" + (f" ({why})" if why else ""))
    print(f"server logs: {out_dir}")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
