"""Execution-environment archives sent with a load request (file overrides) and the
limits on what any archive may unpack to.

An uploaded archive lives in a fresh private folder at each load, so its unpacked copy
is keyed by content: the same archive loaded again unpacks once, the copy is deleted
when its model is unloaded, and what is left is deleted when the server exits (each
load used to leave a new copy behind, for ever). An archive that unpacks past
--backend-config=python,execution-env-max-unpacked-bytes / -files is a load error, and
nothing of it stays on disk.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from mini_triton.backends.python import env_cache
from serverproc import ServerProcess
from test_python_exec_env import MODEL, make_venv, pack

UPLOADED_CONFIG = {
    "backend": "python",
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]},
               {"name": "INFO", "data_type": "TYPE_STRING", "dims": [4]}],
    "parameters": {"EXECUTION_ENV_PATH": {
        "string_value": "$$TRITON_MODEL_DIRECTORY/1/env.tar.gz"}}}


def copies(cache: Path) -> list[str]:
    return sorted(entry.name for entry in cache.iterdir()
                  if entry.is_dir() and not entry.name.startswith("worker-"))


@pytest.fixture(scope="module")
def archive_bytes(tmp_path_factory) -> bytes:
    root = tmp_path_factory.mktemp("upload_env")
    return pack(make_venv(root / "venv", copies=True), root / "env.tar.gz").read_bytes()


def start(tmp_path: Path, *flags: str, repository: Path | None = None) -> ServerProcess:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700, exist_ok=True)
    repository = repository or tmp_path / "models"
    repository.mkdir(exist_ok=True)
    env = dict(os.environ, **{env_cache.CACHE_ENVIRONMENT: str(cache)})
    server = ServerProcess(["--model-repository", str(repository),
                            "--model-control-mode=explicit", "--exit-on-error=false",
                            *flags], env=env, ready_timeout=240)
    server.cache = cache
    return server


def load_uploaded(client, archive: bytes) -> None:
    client.load_model("up", config=json.dumps(UPLOADED_CONFIG),
                      files={"file:1/model.py": MODEL.encode(), "file:1/env.tar.gz": archive})


def test_uploaded_archive_unpacks_once_and_goes_with_its_model(tmp_path, archive_bytes):
    with start(tmp_path) as server:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=240)
        load_uploaded(client, archive_bytes)
        first = copies(server.cache)
        assert len(first) == 1, first
        load_uploaded(client, archive_bytes)  # the same archive again: the same copy
        assert copies(server.cache) == first
        assert client.is_model_ready("up")
        client.unload_model("up")
        assert copies(server.cache) == []  # its model is gone: so is the copy
        load_uploaded(client, archive_bytes)
        assert copies(server.cache) == first
    # The server exited with the model loaded: what it unpacked for it is gone.
    assert server.proc.returncode is not None
    assert copies(server.cache) == []


def archive_of(files: dict[str, bytes], path: Path) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    return path


@pytest.mark.parametrize("files, flag, says", [
    ({"bin/zeros": b"\0" * (8 * 1024 * 1024)},
     "execution-env-max-unpacked-bytes=4194304",
     "it unpacks to more than 4194304 bytes (execution-env-max-unpacked-bytes)"),
    ({f"lib/f{i}": b"x" for i in range(50)},
     "execution-env-max-unpacked-files=20",
     "it unpacks to more than 20 files (execution-env-max-unpacked-files)"),
])
def test_an_archive_past_the_limits_is_a_load_error_and_leaves_nothing(
        tmp_path, files, flag, says):
    archive = archive_of(files, tmp_path / "big.tar.gz")
    assert archive.stat().st_size < 64 * 1024  # a small archive, a large unpacking
    with start(tmp_path, f"--backend-config=python,{flag}") as server:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=240)
        with pytest.raises(InferenceServerException) as caught:
            client.load_model("big", config=json.dumps(
                {**UPLOADED_CONFIG, "parameters": {"EXECUTION_ENV_PATH": {
                    "string_value": "$$TRITON_MODEL_DIRECTORY/1/env.tar.gz"}}}),
                files={"file:1/model.py": MODEL.encode(),
                       "file:1/env.tar.gz": archive.read_bytes()})
        assert says in caught.value.message()
        assert copies(server.cache) == []
