"""What a FIL or OpenVINO model gets from the machine before it serves: its library
(missing: UNAVAILABLE with the command that installs it) and its compute threads."""

from __future__ import annotations

import sys

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from mini_triton.backends import cpu_share
from mini_triton.backends.registry import backend_class
from mini_triton.core.errors import Code, TritonError

LIBRARIES = {"fil": ("treelite", "mini_triton.backends.fil", "fil"),
             "openvino": ("openvino", "mini_triton.backends.openvino", "openvino")}


@pytest.mark.parametrize("backend", sorted(LIBRARIES))
def test_a_missing_library_makes_the_model_unavailable_with_the_install_command(
        monkeypatch, backend):
    library, package, extra = LIBRARIES[backend]
    # As on a machine without the library: `import library` raises ImportError.
    monkeypatch.setitem(sys.modules, library, None)
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(TritonError) as error:
        backend_class(backend)
    assert error.value.code == Code.UNAVAILABLE
    assert f"backend '{backend}' is not installed" in error.value.message
    assert f"pip install 'mini-triton[{extra}]'" in error.value.message


def _config(*counts: int) -> mc.ModelConfig:
    config = mc.ModelConfig(name="m")
    for count in counts:
        config.instance_group.add(count=count, kind=mc.ModelInstanceGroup.KIND_CPU)
    return config


@pytest.mark.parametrize("cores, counts, threads", [
    (2, (1,), 1),       # one core stays with the front end
    (16, (1,), 15),
    (16, (2,), 7),
    (16, (2, 3), 3),    # every group's instances share the cores
    (1, (1,), 1),       # never fewer than one
    (4, (8,), 1),
])
def test_instances_share_the_cores_less_the_front_ends_one(monkeypatch, cores, counts, threads):
    monkeypatch.setattr(cpu_share, "available_cores", lambda: cores)
    assert cpu_share.instance_threads(_config(*counts)) == threads

