"""Graceful shutdown: SIGTERM lets slow in-flight requests finish, then exits 0."""

from __future__ import annotations

import threading
import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from serverproc import ServerProcess

SLOW = """
name: "slow"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 1 ] } ]
instance_group [ { count: 4 } ]
parameters { key: "execute_delay_ms" value: { string_value: "1500" } }
"""


def send(module, url, value, results):
    client = module.InferenceServerClient(url)
    tensor = module.InferInput("INPUT0", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
    try:
        result = client.infer("slow", [tensor], client_timeout=30) if module is grpcclient \
            else client.infer("slow", [tensor])
        results[value] = int(result.as_numpy("OUTPUT0")[0])
    except Exception as error:  # recorded, asserted below
        results[value] = error
    finally:
        client.close()


def test_sigterm_drains_in_flight_requests(tmp_path):
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
    time.sleep(0.5)  # the requests are now executing (each takes 1.5 s)
    status = server.stop(timeout=30)
    for thread in threads:
        thread.join(30)
    assert status == 0, server.output
    assert results == {0: 0, 1: 1, 2: 2, 3: 3}, results
    assert "Server stopped" in server.output
