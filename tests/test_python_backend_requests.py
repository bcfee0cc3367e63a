"""Triton Python-backend models in both execution modes: what a request carries in and
what comes back out besides tensors. Custom metrics on the metrics endpoint, errors that
fail only their request, and request parameters, ids and flags as Triton writes them."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from conftest import STATUS
from python_backend_served import Client
from python_backend_served import client, served  # noqa: F401 (fixtures)


def test_custom_metrics_on_the_metrics_endpoint(served):
    client = Client("http", served)
    counts = [client.infer("metrics", {"IN": (np.array([v], np.float32), "FP32")})
              .as_numpy("COUNT")[0] for v in (0.5, 5.0, 50.0)]
    assert counts[-1] - counts[0] == 2
    url = f"http://127.0.0.1:{served.ports['metrics']}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    labels = '{model="metrics",version="1"}'
    assert "# TYPE py_requests counter" in text
    assert f"py_requests{labels} {int(counts[-1])}" in text
    assert f"py_last_value{labels} 50" in text
    assert "# TYPE py_values histogram" in text
    assert 'py_values_bucket{model="metrics",version="1",le="+Inf"}' in text
    assert "nv_inference_count" in text


def test_custom_metric_families_are_grouped_by_kind_as_triton_lists_them(served):
    """prometheus-cpp lists counters, gauges, histograms, summaries, each kind in the
    order registered: a model's counter follows the nv_* counters, its gauge the nv_*
    gauges (Triton 2.51's page, seen side by side with perf/triton_diff.py)."""
    Client("http", served).infer("metrics", {"IN": (np.array([1.0], np.float32), "FP32")})
    url = f"http://127.0.0.1:{served.ports['metrics']}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    kinds = {line.split()[2]: line.split()[3] for line in text.splitlines()
             if line.startswith("# TYPE")}
    counters = [n for n in names if kinds[n] == "counter"]
    assert counters[-1] == "py_requests"
    assert names.index("py_requests") < names.index("nv_inference_pending_request_count")
    gauges = [n for n in names if kinds[n] == "gauge"]
    assert gauges[-1] == "py_last_value"
    assert names.index("py_last_value") == names.index("py_values") - 1
    assert names[:len(counters)] == counters


def test_error_response_fails_only_its_request(client):
    good, bad = client.infer_in_parallel("errors", [{"IN": (np.array([[0]], np.int32), "INT32")},
                                                    {"IN": (np.array([[1]], np.int32), "INT32")}])
    assert good.as_numpy("IN")[0, 0] == 0
    assert isinstance(bad, InferenceServerException)
    assert "value 1 is refused" in str(bad)
    assert STATUS[client.protocol]["INVALID_ARG"] in str(bad.status())


def test_exception_in_execute_fails_its_requests_with_the_message(client):
    with pytest.raises(InferenceServerException) as caught:
        client.infer("errors", {"IN": (np.array([[2]], np.int32), "INT32")})
    message = str(caught.value)
    assert "Failed to process the request(s) for model 'errors_0'" in message
    assert "ValueError: boom in execute" in message
    assert client.client.is_model_ready("errors")
    result = client.infer("errors", {"IN": (np.array([[0]], np.int32), "INT32")})
    assert result.as_numpy("IN")[0, 0] == 0


@pytest.mark.parametrize("sequence_id", [42, "session-7"])
def test_request_parameters_ids_and_flags(client, sequence_id):
    result = client.infer("parameters", {"IN": (np.array([1], np.int32), "INT32")},
                          request_id="req-1", sequence_id=sequence_id, sequence_start=True,
                          parameters={"temperature": 3, "mode": "fast", "debug": True},
                          outputs=[client.module.InferRequestedOutput(n) for n in (
                              "PARAMETERS", "REQUEST_ID", "CORRELATION_ID",
                              "CORRELATION_TYPE", "FLAGS", "OUTPUTS")])

    def text(name):
        return result.as_numpy(name)[0].decode()

    assert json.loads(text("PARAMETERS")) == {"temperature": 3, "mode": "fast", "debug": True}
    assert text("REQUEST_ID") == "req-1"
    assert text("CORRELATION_ID") == str(sequence_id)
    assert text("CORRELATION_TYPE") == type(sequence_id).__name__
    assert text("FLAGS") == "1"
    assert text("OUTPUTS").split(",") == ["PARAMETERS", "REQUEST_ID", "CORRELATION_ID",
                                          "CORRELATION_TYPE", "FLAGS", "OUTPUTS"]
    response = result.get_response()
    if client.protocol == "http":
        assert response["parameters"] == {"echo": True, "count": 3, "note": "from the model"}
    else:
        assert response.parameters["echo"].bool_param is True
        assert response.parameters["count"].int64_param == 3
        assert response.parameters["note"].string_param == "from the model"


def test_request_parameters_json_is_written_as_triton_writes_it(client):
    """Triton's TritonJson (rapidjson): compact, UTF-8 as is, doubles in rapidjson's form
    (the strings a real Triton 2.51 gave for these parameters)."""
    result = client.infer("parameters", {"IN": (np.array([1], np.int32), "INT32")},
                          parameters={"text": 'é"/\\\t', "big": 1e20, "tiny": 1.5e-7,
                                      "one": 1.0, "n": -3, "on": True},
                          outputs=[client.module.InferRequestedOutput("PARAMETERS")])
    text = result.as_numpy("PARAMETERS")[0].decode()
    pieces = ['"text":"é\\"/\\\\\\t"', '"big":100000000000000000000.0', '"tiny":1.5e-7',
              '"one":1.0', '"n":-3', '"on":true']
    if client.protocol == "http":  # JSON keeps the order sent; a protobuf map has none
        assert text == "{" + ",".join(pieces) + "}"
    else:
        assert text.startswith("{") and text.endswith("}")
        assert sorted(text[1:-1].split(",")) == sorted(pieces)
