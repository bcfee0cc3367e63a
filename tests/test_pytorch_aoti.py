"""`platform: "torch_aoti"`: an AOTInductor package made by
`torch._inductor.aoti_compile_and_package`, tensors named by their place (`INPUT__1`) or
by forward()'s terms (`ARGS[0]`, `RESULT[sum]`), and batched by the dynamic batcher
(Triton's own backend serves these at batch size 1 only). Compiling needs a C++ compiler.
"""

from __future__ import annotations

import concurrent.futures
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import connect, protocol_fixture, server_settings
from mini_triton.server import ServerThread

torch = pytest.importorskip("torch", reason="the PyTorch backend needs torch (the [pytorch] "
                                            "extra)")
if shutil.which("g++") is None and shutil.which("c++") is None:
    pytest.skip("compiling an AOTInductor package needs a C++ compiler", allow_module_level=True)

CONFIG = """backend: "pytorch"
platform: "torch_aoti"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 2000000 preferred_batch_size: [ 4 ] }
input [ { name: "ARGS[0]" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 5 ] } ]
output [ { name: "RESULT[sum]" data_type: TYPE_FP32 dims: [ 3 ] },
         { name: "RESULT[scaled]" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


class Scorer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x, y):
        return {"sum": self.linear(x) + y.sum(dim=1, keepdim=True), "scaled": x * 2}


def scorer() -> Scorer:
    torch.manual_seed(0)
    return Scorer().eval()


def compile_package(path: Path) -> None:
    batch = torch.export.Dim("batch", min=1, max=64)
    example = (torch.randn(2, 4), torch.randn(2, 5))
    program = torch.export.export(scorer(), example, dynamic_shapes=({0: batch}, {0: batch}))
    # The wrapper compiled without optimisation: the test's time goes to the compiler.
    torch._inductor.aoti_compile_and_package(
        program, package_path=str(path),
        inductor_configs={"aot_inductor.compile_wrapper_opt_level": "O0"})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("aoti")
    for name in ("scorer", "not_a_package"):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(CONFIG)
    compile_package(root / "scorer" / "1" / "model.pt2")
    (root / "not_a_package" / "1" / "model.pt2").write_bytes(b"not a package")
    with ServerThread(server_settings(root, exit_on_error=False)) as running:
        yield running


aoti_proto = protocol_fixture("server")


def infer_input(proto, name: str, array: np.ndarray):
    tensor = proto.module.InferInput(name, list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return tensor


def expected(x: np.ndarray, y: np.ndarray) -> dict:
    with torch.inference_mode():
        answer = scorer()(torch.from_numpy(x), torch.from_numpy(y))
    return {name: value.numpy() for name, value in answer.items()}


def test_aoti_package_answers_as_the_eager_model(aoti_proto):
    rng = np.random.default_rng(0)
    x, y = rng.random((3, 4), dtype=np.float32), rng.random((3, 5), dtype=np.float32)
    result = aoti_proto.client.infer("scorer", [infer_input(aoti_proto, "INPUT__1", y),
                                                infer_input(aoti_proto, "ARGS[0]", x)])
    want = expected(x, y)
    np.testing.assert_allclose(result.as_numpy("RESULT[sum]"), want["sum"], rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(result.as_numpy("RESULT[scaled]"), want["scaled"])


def test_aoti_requests_are_batched_together(server):
    rng = np.random.default_rng(1)
    xs, ys = rng.random((4, 1, 4), dtype=np.float32), rng.random((4, 1, 5), dtype=np.float32)

    def send(index: int):
        proto = connect("grpc", server)
        try:
            result = proto.client.infer("scorer", [infer_input(proto, "ARGS[0]", xs[index]),
                                                   infer_input(proto, "INPUT__1", ys[index])])
            return result.as_numpy("RESULT[sum]")
        finally:
            proto.client.close()

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(send, range(4)))
    for index, answer in enumerate(answers):
        np.testing.assert_allclose(answer, expected(xs[index], ys[index])["sum"], rtol=1e-5,
                                   atol=1e-6)
    proto = connect("http", server)
    stats = proto.model_statistics("scorer")
    proto.client.close()
    assert max(int(b["batch_size"]) for b in stats["batch_stats"]) > 1


def test_a_file_that_is_not_a_package_is_unavailable_naming_it(server):
    reasons = {entry["name"]: entry.get("reason", "") for entry in server.server.manager.index()}
    assert "not_a_package/1/model.pt2' is not an AOTInductor package" in reasons["not_a_package"]
    assert "aoti_compile_and_package" in reasons["not_a_package"]
