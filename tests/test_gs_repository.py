"""gs:// model repositories against a local Cloud Storage emulator
(gcp-storage-emulator), driven by the real mini_triton server with stock tritonclient.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from cloud_repositories import _spec, cache_of, clients, start_failure, stop_emulator
from cloud_repositories import mount  # noqa: F401 (a fixture)
from conftest import free_port
from serverproc import ServerProcess
from test_lifecycle import IDENTITY, echo, index, wait_until


# --- gs:// against a local Cloud Storage emulator (gcp-storage-emulator) ---
#
# The emulator keeps no credentials, so refused credentials are untested for gs://;
# a missing bucket, the three modes and the mirror are tested.


def require_gcs_tools() -> None:
    """Skip (outside CI) or fail (CI=true) when the client or the emulator is missing."""
    missing = [name for name in ("google.cloud.storage", "gcp_storage_emulator")
               if _spec(name) is None]
    if not missing:
        return
    reason = f"{' and '.join(missing)} not installed"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI must install them (pip install -e '.[test]')",
                    pytrace=False)
    pytest.skip(f"{reason} (install with pip install -e '.[test]')")


@pytest.fixture(scope="module")
def gcs_emulator(tmp_path_factory):
    require_gcs_tools()
    port = free_port()
    tmp = tmp_path_factory.mktemp("gcs")
    log = open(tmp / "gcs.log", "w")
    command = [sys.executable, "-c", "from gcp_storage_emulator.__main__ import main; main()",
               "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"]
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError("gcs emulator exited:\n" + (tmp / "gcs.log").read_text())
        try:
            with urllib.request.urlopen(url + "/", timeout=2):
                break
        except urllib.error.HTTPError:
            break
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() > deadline:
                raise RuntimeError("gcs emulator did not start") from None
            time.sleep(0.05)
    yield url
    stop_emulator(proc, log)


def gcs_env(emulator: str, mount: Path | None = None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GOOGLE_", "TRITON_GCS_", "STORAGE_EMULATOR_"))}
    env["STORAGE_EMULATOR_HOST"] = emulator
    if mount is not None:
        env["TRITON_GCS_MOUNT_DIRECTORY"] = str(mount)
    return env


@pytest.fixture
def gcs_bucket(gcs_emulator, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    from google.cloud import storage

    client = storage.Client()
    return client.create_bucket(f"models-{uuid.uuid4().hex[:12]}")


def gcs_put_model(bucket, name: str, versions=(1,)) -> None:
    bucket.blob(f"repo/{name}/config.pbtxt").upload_from_string(
        IDENTITY.format(name=name, extra=""))
    for version in versions:
        bucket.blob(f"repo/{name}/{version}/weights").upload_from_string(b"\x00" * 16)


def test_gs_poll_mode_follows_the_bucket(gcs_emulator, gcs_bucket, mount):
    gcs_put_model(gcs_bucket, "g")
    args = [f"--model-repository=gs://{gcs_bucket.name}/repo", "--model-control-mode=poll",
            "--repository-poll-secs=1"]
    with ServerProcess(args, env=gcs_env(gcs_emulator, mount)) as server:
        http, grpc = clients(server)
        assert echo(http, "g") == "1" and echo(grpc, "g") == "1"
        assert (cache_of(mount) / "g" / "1" / "weights").is_file()
        gcs_bucket.blob("repo/g/2/weights").upload_from_string(b"v2")
        wait_until(lambda: echo(grpc, "g") == "2", what="version 2 served")
        for blob in list(gcs_bucket.list_blobs(prefix="repo/g/")):
            blob.delete()
        wait_until(lambda: not http.client.is_model_ready("g"), what="model unloaded")
        for protocol in (http, grpc):
            protocol.client.close()
        server.stop()
    assert list(mount.iterdir()) == []


def test_gs_explicit_mode(gcs_emulator, gcs_bucket, mount):
    gcs_put_model(gcs_bucket, "one")
    gcs_put_model(gcs_bucket, "two")
    args = [f"--model-repository=gs://{gcs_bucket.name}/repo", "--model-control-mode=explicit"]
    with ServerProcess(args, env=gcs_env(gcs_emulator, mount)) as server:
        http, grpc = clients(server)
        assert {e["name"] for e in index(http)} == {"one", "two"}
        grpc.client.load_model("two")
        assert echo(http, "two") == "1"
        http.client.unload_model("two")
        assert not grpc.client.is_model_ready("two")
        assert not grpc.client.is_model_ready("one")
        for protocol in (http, grpc):
            protocol.client.close()


def test_gs_missing_bucket_stops_the_server_in_one_line(gcs_emulator):
    url = "gs://no-such-bucket-here/repo"
    status, errors = start_failure([f"--model-repository={url}"], gcs_env(gcs_emulator))
    assert status == 1
    assert len(errors) == 1, errors
    assert url in errors[0] and "bucket 'no-such-bucket-here' does not exist" in errors[0]


def test_gs_unreachable_endpoint_stops_the_server_in_one_line(gcs_emulator):
    url = "gs://some-bucket/repo"
    env = gcs_env(f"http://127.0.0.1:{free_port()}")
    status, errors = start_failure([f"--model-repository={url}"], env)
    assert status == 1
    assert len(errors) == 1, errors
    assert url in errors[0] and "not reachable" in errors[0]
