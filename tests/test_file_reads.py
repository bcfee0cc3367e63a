"""Files that a model repository or a client names are read only when they are regular
files, never past a cap, and off the event loop: a config.pbtxt that is a FIFO (which
held the server's one loop thread until a writer came) or a link to /dev/zero (read
until the kernel killed the server) is refused with a reason, and the server goes on
serving."""

from __future__ import annotations

import os
import threading
import time

import httpx
import pytest

from conftest import server_settings
from mini_triton.config import MAX_CONFIG_BYTES
from mini_triton.core.files import FileRefused, check_regular, read_regular
from mini_triton.server import ServerThread
from python_models import IDENTITY
from serverproc import ServerProcess
from test_sagemaker import write_model


PYTHON_CONFIG = ('backend: "python"\nmax_batch_size: 0\n'
                 'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
                 'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')


def make_fifo(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


# --- the reader ---


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = make_fifo(tmp_path / "config.pbtxt")
    with pytest.raises(FileRefused, match="is a FIFO, not a regular file"):
        read_regular(fifo, 1024)  # returns at once: the test would hang otherwise
    with pytest.raises(FileRefused, match="is a FIFO"):
        check_regular(fifo)


def test_a_link_to_a_device_is_refused(tmp_path):
    link = tmp_path / "config.pbtxt"
    link.symlink_to("/dev/zero")
    with pytest.raises(FileRefused, match="is a character device \\(through a link\\)"):
        read_regular(link, MAX_CONFIG_BYTES)


def test_a_regular_file_is_read_up_to_its_cap(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    (tmp_path / "link").symlink_to(path)
    assert read_regular(tmp_path / "link", 100) == b"x" * 100
    with pytest.raises(FileRefused, match="100 bytes or more, more than the 99 allowed"):
        read_regular(path, 99)


# --- the server ---


def test_repository_scan_refuses_fifo_and_device_configs(tmp_path):
    """At start-up every model of the repository loads: the FIFO and /dev/zero configs
    become UNAVAILABLE models whose reason says what the file is, the others serve."""
    repository = tmp_path / "repo"
    write_model(repository / "echo", "echo")
    (repository / "fifo" / "1").mkdir(parents=True)
    make_fifo(repository / "fifo" / "config.pbtxt")
    (repository / "zero" / "1").mkdir(parents=True)
    (repository / "zero" / "config.pbtxt").symlink_to("/dev/zero")
    # A Python model whose folder holds a FIFO named like code: the look for
    # auto_complete_config skips it, and the model loads.
    (repository / "py" / "1").mkdir(parents=True)
    (repository / "py" / "1" / "model.py").write_text(IDENTITY)
    make_fifo(repository / "py" / "1" / "helper.py")
    (repository / "py" / "config.pbtxt").write_text(PYTHON_CONFIG)
    # A Python model whose model.py is a FIFO: refused, not imported.
    (repository / "py_fifo" / "1").mkdir(parents=True)
    make_fifo(repository / "py_fifo" / "1" / "model.py")
    (repository / "py_fifo" / "config.pbtxt").write_text(PYTHON_CONFIG)
    with ServerThread(server_settings(repository, exit_on_error=False)) as server:
        index = httpx.post(f"http://127.0.0.1:{server.ports['http']}/v2/repository/index",
                           timeout=30).json()
    states = {entry["name"]: entry for entry in index}
    assert states["echo"]["state"] == "READY"
    assert states["py"]["state"] == "READY", states["py"]
    assert states["py_fifo"]["state"] == "UNAVAILABLE"
    assert "model.py' is a FIFO, not a regular file" in states["py_fifo"]["reason"]
    assert states["fifo"]["state"] == "UNAVAILABLE"
    assert "is a FIFO, not a regular file" in states["fifo"]["reason"]
    assert states["zero"]["state"] == "UNAVAILABLE"
    assert "is a character device (through a link)" in states["zero"]["reason"]


@pytest.fixture()
def sagemaker(tmp_path):
    repository = tmp_path / "repo"
    write_model(repository / "echo", "echo")
    server = ServerProcess(["--model-repository", str(repository), "--allow-sagemaker=true",
                            "--sagemaker-port=0", "--model-control-mode=explicit",
                            "--load-model=echo"], services=("http", "grpc", "sagemaker"))
    with server:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.ports['sagemaker']}",
                          timeout=20) as client:
            yield client


def test_sagemaker_load_of_a_fifo_config_keeps_the_server_answering(sagemaker, tmp_path):
    """The load's folder search reads the configs off the loop and refuses the FIFO: the
    load gets a 400 that names it, and /ping answers meanwhile."""
    url = tmp_path / "upload"
    (url / "model" / "1").mkdir(parents=True)
    make_fifo(url / "model" / "config.pbtxt")
    pings: list[float] = []
    done = threading.Event()

    def ping_meanwhile():
        with httpx.Client(base_url=str(sagemaker.base_url), timeout=20) as client:
            while not done.is_set():
                started = time.monotonic()
                assert client.get("/ping").status_code == 200
                pings.append(time.monotonic() - started)
                time.sleep(0.05)

    pinger = threading.Thread(target=ping_meanwhile)
    pinger.start()
    while not pings and pinger.is_alive():
        time.sleep(0.01)
    try:
        loaded = sagemaker.post("/models", json={"model_name": "f", "url": str(url)})
    finally:
        done.set()
        pinger.join(30)
    assert loaded.status_code == 400
    assert "is a FIFO, not a regular file" in loaded.json()["error"]
    assert pings and max(pings) < 5.0  # generous for 2 loaded cores; it hung before
    assert sagemaker.get("/models").json() == {"models": []}
