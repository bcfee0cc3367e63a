"""Graceful shutdown: SIGTERM turns readiness to 400 at once, lets slow in-flight
requests finish, then exits 0."""

from __future__ import annotations

import signal
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from model_configs import INPUT0_OUTPUT0_INT32, slow_identity
from serverproc import ServerProcess

SLOW = slow_identity(3000, instances=4)


def send(module, url, value, results, model="slow"):
    client = module.InferenceServerClient(url)
    tensor = module.InferInput("INPUT0", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
    try:
        result = client.infer(model, [tensor], client_timeout=30) if module is grpcclient \
            else client.infer(model, [tensor])
        results[value] = int(result.as_numpy("OUTPUT0")[0])
    except Exception as error:  # recorded, asserted below
        results[value] = error
    finally:
        client.close()


def health_status(url: str) -> int | None:
    """The HTTP status of a health endpoint; None once the listener is closed."""
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return reply.status
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def health_answers(http_url: str, requests_done) -> list[tuple[int, int | None, bool]]:
    """Ask /v2/health/ready and /v2/health/live every 50 ms until the server stops
    answering: (ready status, live status, whether every request had finished when
    both had answered) each time, so `False` means the requests were still in flight."""
    answers = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ready = health_status(f"http://{http_url}/v2/health/ready")
        if ready is None:
            break  # the listener is closed: the drain is over
        live = health_status(f"http://{http_url}/v2/health/live")
        answers.append((ready, live, requests_done()))
        time.sleep(0.05)
    return answers


def test_sigterm_drains_in_flight_requests_while_readiness_is_400(tmp_path):
    """What Kubernetes reads during a pod's termination: from SIGTERM on, the readiness
    probe gets Triton's 400 (so no new traffic is routed here) and liveness stays 200
    while the requests already executing finish successfully; then the process exits 0."""
    (tmp_path / "slow" / "1").mkdir(parents=True)
    (tmp_path / "slow" / "config.pbtxt").write_text(SLOW)
    server = ServerProcess(["--model-repository", str(tmp_path), "--exit-timeout-secs=20"])
    server.start()
    results: dict = {}
    threads = [threading.Thread(target=send, args=(module, url, value, results))
               for value, (module, url) in enumerate(
                   [(httpclient, server.http_url)] * 2 + [(grpcclient, server.grpc_url)] * 2)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # the requests are now executing (each takes 3 s)
    server.proc.send_signal(signal.SIGTERM)
    answers = health_answers(server.http_url, lambda: len(results) == len(threads))
    status = server.stop(timeout=30)
    for thread in threads:
        thread.join(30)
    assert status == 0, server.output
    assert results == {0: 0, 1: 1, 2: 2, 3: 3}, results
    assert "Server stopped" in server.output
    in_flight = [(ready, live) for ready, live, done in answers if not done]
    assert (400, 200) in in_flight, f"no 400 while requests were in flight: {answers}"
    # Once not ready, never ready again until the process is gone; live throughout
    # (None: the listener closed between the two questions, at the end of the drain).
    readiness = [ready for ready, _, _ in answers]
    assert 200 not in readiness[readiness.index(400):], answers
    assert {live for _, live, _ in answers} <= {200, None}, answers


STUCK_MODEL = '''
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(120)  # never done within any exit timeout of these tests
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.zeros(1, np.int32))])
                for _ in requests]
'''

STUCK_CONFIG = 'name: "stuck"\nbackend: "python"\n' + INPUT0_OUTPUT0_INT32


def test_sigterm_stops_a_model_still_executing_after_the_exit_timeout(tmp_path):
    """The exit timeout bounds the shutdown: a Python model still executing when it
    runs out is stopped with its worker, instead of being waited for (its finalize
    would queue behind the execution) for another ten seconds."""
    (tmp_path / "stuck" / "1").mkdir(parents=True)
    (tmp_path / "stuck" / "1" / "model.py").write_text(STUCK_MODEL)
    (tmp_path / "stuck" / "config.pbtxt").write_text(STUCK_CONFIG)
    server = ServerProcess(["--model-repository", str(tmp_path), "--exit-timeout-secs=2"])
    server.start()
    results: dict = {}
    thread = threading.Thread(target=send, args=(httpclient, server.http_url, 1, results,
                                                 "stuck"))
    thread.start()
    time.sleep(0.5)  # the request is executing now
    started = time.monotonic()
    status = server.stop(timeout=30)
    took = time.monotonic() - started
    thread.join(30)
    assert status == 0, server.output
    assert "did not finalize in time" in server.output
    assert isinstance(results.get(1), Exception), results
    # the exit timeout (2 s), the drain of the model's open requests (2 s more) and the
    # short wait for a busy worker's finalize: about 6 s here; it took 16 s when the
    # finalize of a busy worker was given its full ten seconds
    assert took < 12, (took, server.output)
