#!/usr/bin/env python3
"""The server's own cost per request on the path every protocol shares, in-process:
`InferenceService.start_unary` → validation → the loop-driven dynamic batcher → the
Python backend's process link → the worker's identity model (perf/repos/python_identity)
→ the reply back to the caller's `on_final`. No front end, no sockets to a client.

Requests go in waves, each started at once from one loop callback, as a front end
starts them: a wave of 1 is concurrency 1; a wave of 17 forms the batches of a busy
model at concurrency 16 (one request alone, then two full batches of 8). Busy polling
is off, so that the same requests run the same code every time.

Two source trees are measured alternately, each in its own process:

    git worktree add /tmp/mt-before main
    .venv/bin/python perf/bench_shared_path.py /tmp/mt-before . [--rounds 3] [--wave 17]
        [--datatype BYTES]

Prints, per request: the µs of the server process's CPU and Python bytecodes run in it
(the count does not move with the machine's load), every round and the best time of
each tree. With `--process worker` the bytecodes are the model's worker process's
instead (it runs under a small wrapper that counts while the server signals it to).
"""

from __future__ import annotations

import sys

from two_trees import ROUND_PRELUDE, compare_trees, tree_arguments

ROUND = ROUND_PRELUDE + r"""
import asyncio, json, logging, os, signal, sys, tempfile, time
from pathlib import Path

os.environ["MINI_TRITON_PYTHON_BUSY_POLL_US"] = "0"
logging.disable(logging.WARNING)
from mini_triton.backends.python import worker_process
from mini_triton.core.request import InferenceRequest
from mini_triton.core.tensor import RequestedOutput, Tensor
from mini_triton.server import Server, Settings

# The worker, counting its bytecodes between two SIGUSR1 (then writing the count out).
WORKER_COUNTER = '''
import os, signal, sys
from mini_triton.backends.python import worker
counted = 0
def tracer(frame, event, arg):
    global counted
    frame.f_trace_opcodes = True
    if event == "opcode":
        counted += 1
    return tracer
def toggle(signum, frame):
    if sys.gettrace() is None:
        sys.settrace(tracer)
        return
    sys.settrace(None)
    with open(os.environ["BENCH_WORKER_COUNT"], "w") as out:
        out.write(str(counted))
signal.signal(signal.SIGUSR1, toggle)
worker.main(sys.argv)
'''
COUNT_WORKER = sys.argv[3] == "worker"
if COUNT_WORKER:
    folder = tempfile.mkdtemp()
    Path(folder, "bench_worker_counter.py").write_text(WORKER_COUNTER)
    os.environ["PYTHONPATH"] = os.pathsep.join([os.environ.get("PYTHONPATH", ""), folder])
    os.environ["BENCH_WORKER_COUNT"] = os.path.join(folder, "count")
    worker_process.WORKER_MODULE = "bench_worker_counter"


def worker_pid():
    import psutil
    return next(child.pid for child in psutil.Process().children()
                if "bench_worker_counter" in " ".join(child.cmdline()))


async def count_worker(run):
    '''The worker's bytecodes while `run()` runs.'''
    pid, path = worker_pid(), Path(os.environ["BENCH_WORKER_COUNT"])
    os.kill(pid, signal.SIGUSR1)
    await asyncio.sleep(0.2)  # the worker is idle: its handler runs now
    await run()
    os.kill(pid, signal.SIGUSR1)
    for _ in range(100):
        await asyncio.sleep(0.05)
        if path.exists() and path.read_text():
            return int(path.read_text())
    raise SystemExit("the worker wrote no count")

# 16 FP32, or 16 BYTES elements of perf_analyzer's default 128 characters, framed
BYTES_MODEL = sys.argv[4] == "BYTES"
MODEL, REPOSITORY = (("identity_bytes_py", "python_bytes") if BYTES_MODEL
                     else ("identity_py", "python_identity"))
PAYLOAD = (b"".join(len(s).to_bytes(4, "little") + s for s in [b"x" * 128] * 16)
           if BYTES_MODEL else bytes(64))


def request():
    # What the HTTP codec makes of perf_analyzer's request (binary input and output).
    return InferenceRequest(MODEL, "", inputs=[
        Tensor("INPUT0", "BYTES" if BYTES_MODEL else "FP32", (1, 16),
               raw=memoryview(PAYLOAD), parameters={"binary_data_size": len(PAYLOAD)})],
        outputs=[RequestedOutput("OUTPUT0", {"binary_data": True})])


async def main(waves, size):
    repository = Path.cwd() / "perf" / "repos" / REPOSITORY
    server = Server(Settings(model_repositories=[repository], allow_http=False,
                             allow_grpc=False, allow_metrics=False))
    await server.start()
    service = server.service
    loop = asyncio.get_running_loop()

    async def wave():
        done = loop.create_future()
        left = size

        def answered(response):
            nonlocal left
            assert response.error is None, response.error
            left -= 1
            if not left:
                done.set_result(None)

        def start():
            for _ in range(size):
                service.start_unary(request(), "HTTP end point", answered)

        loop.call_soon(start)
        await done

    for _ in range(200):
        await wave()
    cpu, started = time.process_time(), time.perf_counter()
    for _ in range(waves):
        await wave()
    cpu_us = (time.process_time() - cpu) / (waves * size) * 1e6
    opcodes = 0

    def tracer(frame, event, arg):
        nonlocal opcodes
        frame.f_trace_opcodes = True
        if event == "opcode":
            opcodes += 1
        return tracer

    traced = 50

    async def traced_waves():
        for _ in range(traced):
            await wave()

    if COUNT_WORKER:
        opcodes = await count_worker(traced_waves)
    else:
        sys.settrace(tracer)
        await traced_waves()
        sys.settrace(None)
    await server.shutdown()
    return cpu_us, opcodes / (traced * size)

import uvloop
print(json.dumps(uvloop.run(main(int(sys.argv[1]), int(sys.argv[2])))))
"""


def main() -> int:
    parser = tree_arguments(__doc__.splitlines()[0])
    parser.add_argument("--waves", type=int, default=1000, help="timed waves per round")
    parser.add_argument("--wave", type=int, default=17, help="requests per wave")
    parser.add_argument("--process", choices=("server", "worker"), default="server",
                        help="whose bytecodes to count")
    parser.add_argument("--datatype", choices=("FP32", "BYTES"), default="FP32",
                        help="the echoed tensor: 16 FP32 (identity_py), or 16 BYTES of 128 "
                             "bytes each (identity_bytes_py, perf/repos/python_bytes)")
    args = parser.parse_args()
    return compare_trees(ROUND, [str(args.waves), str(args.wave), args.process, args.datatype],
                         "request", args)


if __name__ == "__main__":
    sys.exit(main())
